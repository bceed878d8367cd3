"""Paged attention over this worker's heads, and the metadata a step gives it."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from pagedchat.engine.layers.linear import Linear
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


class Attention(nn.Module):
    """Column-parallel QKV over this worker's heads, row-parallel output projection. K/V are
    read and written only through the kernels, via the block tables in the metadata."""

    def __init__(self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel) -> None:
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

    def forward(self, x: torch.Tensor, rope: Rope, meta: AttentionMetadata) -> torch.Tensor:
        q = self.kernels.rotary_store(self.qkv_proj(x), *rope, self.num_heads, self.k_cache,
                                      self.v_cache, meta.slot_mapping)
        return self.attend(q, self.k_cache, self.v_cache, meta)

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        """The rotated queries ``[tokens, heads, head_dim]`` over the paged caches, through
        the output projection and summed over the workers."""
        out = self.kernels.paged_attention(
            q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.query_start_loc,
            self.scale, max_query_len=meta.max_query_len, max_context_len=meta.max_context_len)
        return self.tp.all_reduce(self.o_proj(out.reshape(-1, self.q_size)))
