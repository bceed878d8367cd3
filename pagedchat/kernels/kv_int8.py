"""8-bit KV cache rows (``--kv-cache-dtype int8``): each token's head is stored as its
``head_dim`` values rounded to int8 and, beside them, the float16 scale that de-quantizes
them (``value = q * scale``, ``scale = max |x| / 127`` rounded to float16). The scale is
per token and head, so storing a token never touches the rest of its block, and it lives
in the block's own bytes, so a copy-on-write, a swap or a shared prefix block carries it
with the values. An int8 cache is ``[num_blocks, block_size, num_kv_heads, head_dim + 2]``.

The compiled kernels quantize with the same float32 operations in the same order (the
scale, its float16 rounding, the reciprocal, each value times it, rounded half to even),
so a row they store is byte for byte the row :func:`quantize` makes."""

from __future__ import annotations

import torch

SCALE_BYTES = 2  # the float16 scale after each head's values
_INV_127 = 1.0 / 127.0


def head_dim_of(cache: torch.Tensor) -> int:
    """The head size of a KV cache of either kind (its last dimension less the scale's
    bytes where it holds int8 rows)."""
    return cache.shape[-1] - (SCALE_BYTES if cache.dtype == torch.int8 else 0)


def quantize(x: torch.Tensor) -> torch.Tensor:
    """Rows ``[..., head_dim]`` (any float type) as int8 rows ``[..., head_dim + 2]``."""
    x = x.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) * _INV_127).half()
    wide = scale.float()
    inverse = torch.where(wide > 0, 1.0 / wide, torch.zeros_like(wide))
    q = torch.round(x * inverse).clamp_(-127, 127).to(torch.int8)
    return torch.cat((q, scale.view(torch.int8)), dim=-1)


def dequantize(rows: torch.Tensor) -> torch.Tensor:
    """Int8 rows ``[..., head_dim + 2]`` as float32 ``[..., head_dim]``."""
    scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float16).float()
    return rows[..., :-SCALE_BYTES].float() * scale
