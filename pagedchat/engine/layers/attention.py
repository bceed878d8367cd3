"""Paged attention over this worker's heads, and the metadata a step gives it."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from pagedchat.engine.layers.linear import Linear
from pagedchat.engine.layers.norm import RMSNorm
from pagedchat.engine.layers.rotary import Rope
from pagedchat.engine.model_config import ModelConfig
from pagedchat.engine.parallel.tensor_parallel import TensorParallel


@dataclass
class AttentionMetadata:
    """Where each new token's K/V goes and which cached tokens each query reads."""

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = skip
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with -1
    context_lens: torch.Tensor  # [num_seqs] int32, tokens in cache after this step
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    # the largest query chunk and context_len, known on the host: the kernels' launch hints
    max_query_len: int
    max_context_len: int
    window: int | None = None  # a local layer group's sliding window (Gemma 3)


class Attention(nn.Module):
    """Column-parallel QKV over this worker's heads, row-parallel output projection. K/V are
    read and written only through the kernels, via the block tables in the metadata. With
    ``qk_norm`` (an RMSNorm class: Qwen 3's, Gemma 3's), each head of Q and of K is normed
    after the projection, before rotary and the K/V store, as transformers does."""

    def __init__(self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel,
                 qk_norm: type[RMSNorm] | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads // tp.size
        self.num_kv_heads = config.num_key_value_heads // tp.size
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                               config.attention_bias, kernels)
        self.o_proj = Linear(self.q_size, config.hidden_size, False, kernels)
        self.scale = self.head_dim**-0.5
        self.kernels = kernels
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.q_norm = self.k_norm = None
        if qk_norm is not None:
            self.q_norm = qk_norm(self.head_dim, config.rms_norm_eps, kernels)
            self.k_norm = qk_norm(self.head_dim, config.rms_norm_eps, kernels)

    def forward(self, x: torch.Tensor, rope: Rope, meta: AttentionMetadata) -> torch.Tensor:
        return self.attend(self.rotate_store(x, rope, meta), self.k_cache, self.v_cache, meta)

    def rotate_store(self, x: torch.Tensor, rope: Rope, meta: AttentionMetadata) -> torch.Tensor:
        """The rotated (and normed) queries ``[tokens, heads, head_dim]``; the rotated keys
        and the values written to the caches."""
        qkv = self.qkv_proj(x)
        if self.q_norm is not None:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q, _ = self.q_norm(q.reshape(-1, self.head_dim))
            k, _ = self.k_norm(k.reshape(-1, self.head_dim))
            qkv = torch.cat((q.view(x.shape[0], -1), k.view(x.shape[0], -1), v), dim=-1)
        return self.kernels.rotary_store(qkv, *rope, self.num_heads, self.k_cache,
                                         self.v_cache, meta.slot_mapping)

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        """The rotated queries ``[tokens, heads, head_dim]`` over the paged caches, through
        the output projection and summed over the workers."""
        out = self.kernels.paged_attention(
            q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.query_start_loc,
            self.scale, max_query_len=meta.max_query_len, max_context_len=meta.max_context_len,
            window=meta.window)
        return self.tp.all_reduce(self.o_proj(out.reshape(-1, self.q_size)))
