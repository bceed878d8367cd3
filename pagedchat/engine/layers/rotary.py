"""Rotary position embedding: cos/sin as transformers computes them."""

from __future__ import annotations

from typing import Any

import torch

from pagedchat.engine.model_config import ModelConfig

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [tokens, head_dim]


class RotaryEmbedding:
    """cos/sin rows computed as transformers computes its tables (float32), for each step's
    positions only: a table for every position a model takes would hold 2 x positions x head_dim
    floats (Gemma 3's two ropes over 32,768 positions: 128 MiB) for the few rows a step reads."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float) -> None:
        self.inv_freq = inv_freq.float()  # kept float32 whatever the model's dtype
        self.scaling = scaling

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """cos and sin rows for these positions; computed once per step and shared by
        every layer."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.scaling != 1.0:
            cos, sin = cos * self.scaling, sin * self.scaling
        return cos.to(dtype), sin.to(dtype)


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
