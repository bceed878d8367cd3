"""The small operations of a decoder layer on the CPU (layer.c): RMSNorm with the residual add,
rotary embedding with the K/V store, SiLU- and GELU(tanh)-and-multiply, float32 and bfloat16."""

from __future__ import annotations

from collections.abc import Callable

import torch

from pagedchat.kernels import reference
from pagedchat.kernels.cpu.build import FLOAT, INT, INT64, P, declare, kernel
from pagedchat.kernels.kv_int8 import head_dim_of

declare({
    "rms_norm": (None, [P] * 5 + [INT, INT, FLOAT, INT]),
    "rotary_store": (None, [P, INT64] + [P] * 6 + [INT] * 5),
    "rotary_store_kv8": (None, [P, INT64] + [P] * 6 + [INT] * 5),  # into int8 caches
    "silu_mul": (None, [P, P, INT, INT, INT]), "gelu_tanh_mul": (None, [P, P, INT, INT, INT])})


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`pagedchat.kernels.reference.rms_norm`: the residual add
    and the norm in one pass over each row."""
    function = kernel("rms_norm", x, weight, residual)
    if function is None or x.dim() != 2 or not weight.is_contiguous():
        return reference.rms_norm(x, weight, eps, residual)
    x = x.contiguous()
    out = torch.empty_like(x)
    if residual is None:
        total, residual_ptr, total_ptr = x, None, None
    else:
        residual = residual.contiguous()
        total = torch.empty_like(x)
        residual_ptr, total_ptr = residual.data_ptr(), total.data_ptr()
    function(x.data_ptr(), residual_ptr, weight.data_ptr(), out.data_ptr(), total_ptr,
             x.shape[0], x.shape[1], eps, torch.get_num_threads())
    return out, total


def rotary_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
                 k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.reference.rotary_store`, one pass over
    each token: keys and values go straight to their slots."""
    if k_cache.dtype == torch.int8:  # int8 caches (kv_int8.py): quantized as stored
        int8 = v_cache.dtype == torch.int8 and k_cache.is_cpu and v_cache.is_cpu
        function = kernel("rotary_store_kv8", qkv, cos, sin) if int8 else None
    else:
        function = kernel("rotary_store", qkv, cos, sin, k_cache, v_cache)
    if (function is None or qkv.stride(1) != 1 or not k_cache.is_contiguous()
            or not v_cache.is_contiguous()):
        return reference.rotary_store(qkv, cos, sin, num_heads, k_cache, v_cache, slot_mapping)
    tokens, kv_heads, head_dim = qkv.shape[0], k_cache.shape[2], head_dim_of(k_cache)
    cos, sin = cos.contiguous(), sin.contiguous()
    slots = slot_mapping.to(torch.int64).contiguous()
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype)
    function(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
             q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tokens, num_heads, kv_heads,
             head_dim, torch.get_num_threads())
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.reference.silu_mul`, one pass."""
    return _activation_mul("silu_mul", gate_up, reference.silu_mul)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.reference.gelu_tanh_mul`, one pass."""
    return _activation_mul("gelu_tanh_mul", gate_up, reference.gelu_tanh_mul)


def _activation_mul(name: str, gate_up: torch.Tensor,
                    fallback: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``act(gate) * up`` through the C kernel ``name``, or ``fallback`` where none is built."""
    function = kernel(name, gate_up)
    if function is None or gate_up.dim() != 2:
        return fallback(gate_up)
    gate_up = gate_up.contiguous()
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, width, dtype=gate_up.dtype)
    function(gate_up.data_ptr(), out.data_ptr(), rows, width, torch.get_num_threads())
    return out
