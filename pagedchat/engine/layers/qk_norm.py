"""Attention with a norm over each head of Q and of K (Qwen 3's, Gemma 3's)."""

from __future__ import annotations

from types import ModuleType

import torch

from pagedchat.engine.layers.attention import Attention, AttentionMetadata
from pagedchat.engine.layers.norm import RMSNorm
from pagedchat.engine.layers.rotary import Rope
from pagedchat.engine.model_config import ModelConfig
from pagedchat.engine.parallel.tensor_parallel import TensorParallel


class QKNormAttention(Attention):
    """The engine's attention with ``norm`` (an RMSNorm class) applied to each head of Q and
    of K after the projection, before rotary and the K/V store, as transformers does."""

    def __init__(self, config: ModelConfig, kernels: ModuleType, tp: TensorParallel,
                 norm: type[RMSNorm] = RMSNorm) -> None:
        super().__init__(config, kernels, tp)
        self.q_norm = norm(self.head_dim, config.rms_norm_eps, kernels)
        self.k_norm = norm(self.head_dim, config.rms_norm_eps, kernels)

    def forward(self, x: torch.Tensor, rope: Rope, meta: AttentionMetadata) -> torch.Tensor:
        return self.attend(self.normed_store(x, rope, meta), self.k_cache, self.v_cache, meta)

    def normed_store(self, x: torch.Tensor, rope: Rope, meta: AttentionMetadata) -> torch.Tensor:
        """The normed, rotated queries ``[tokens, heads, head_dim]``; the normed, rotated
        keys and the values written to the caches."""
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, _ = self.q_norm(q.reshape(-1, self.head_dim))
        k, _ = self.k_norm(k.reshape(-1, self.head_dim))
        qkv = torch.cat((q.view(tokens, -1), k.view(tokens, -1), v), dim=-1)
        return self.kernels.rotary_store(qkv, *rope, self.num_heads, self.k_cache,
                                         self.v_cache, meta.slot_mapping)
