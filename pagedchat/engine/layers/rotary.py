"""Rotary position embedding: cos/sin tables as transformers computes them."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagedchat.engine.model_config import ModelConfig

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [tokens, head_dim]


class RotaryEmbedding(nn.Module):
    """cos/sin tables computed as transformers does (float32), looked up by position."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float, max_positions: int) -> None:
        super().__init__()
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """cos and sin rows for these positions; looked up once per step and shared by
        every layer."""
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


def rope_parameters(config: ModelConfig, params: dict[str, Any] | None = None,
                    layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """inv_freq and cos/sin scaling of the config's rope (or of ``params``, one layer type's
    own, as Gemma 3's local layers have), as transformers computes them. Scaled rope types
    (llama3, yarn, ...) take transformers' own formulas and config; a GGUF's ``rope_freqs``
    divide the default inverse frequencies, as llama.cpp applies them."""
    params = config.rope_parameters if params is None else params
    rope_type = params["rope_type"]
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("rope over part of each head (partial_rotary_factor) is not supported")
    if rope_type == "default":
        dim = config.head_dim
        base = float(params["rope_theta"])
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        if config.rope_freqs is not None:
            if len(config.rope_freqs) != len(inv_freq):
                raise ValueError(f"{len(config.rope_freqs)} rope_freqs for a head of {dim}")
            inv_freq = inv_freq / torch.tensor(config.rope_freqs, dtype=torch.float)
        return inv_freq, 1.0
    if config.rope_freqs is not None:
        raise ValueError(f"rope_freqs with a rope of type {rope_type!r}")
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope type {rope_type!r}")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](
        AutoConfig.from_pretrained(config.folder), layer_type=layer_type)
    return inv_freq, float(scaling)
