"""What the Triton kernel modules share: whether Triton interprets, device and shape checks of
the attention inputs, and the dot settings that keep float32 exact."""

from __future__ import annotations

import os

import torch
import triton


def _interpreting() -> bool:
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Triton picks interpreter or compiler when it is imported (TRITON_INTERPRET=1 or not).
INTERPRETED = _interpreting()
# Softmax runs in base 2: scores are scaled by log2(e) once.
LOG2E = 1.4426950408889634


def check_device(tensor: torch.Tensor, what: str) -> None:
    """A clear error instead of Triton's when a CPU tensor meets the compiler."""
    if tensor.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            f"{what}: Triton kernels need a GPU, or TRITON_INTERPRET=1 set before triton is "
            "imported to run on CPU; use the torch reference kernels instead"
        )


def dot_settings(dtype: torch.dtype) -> tuple[bool, str]:
    """(UPCAST, DOT_PRECISION): float32 must not go through TF32 to match the reference."""
    upcast = dtype == torch.float32 or INTERPRETED
    return upcast, ("ieee" if upcast else "tf32")


def check_attention_inputs(query: torch.Tensor, k_cache: torch.Tensor,
                           v_cache: torch.Tensor) -> int:
    """The query heads per KV head, after checking shapes, strides, types and device."""
    check_device(query, "paged_attention")
    if query.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"paged_attention: query {tuple(query.shape)} must be [tokens, heads, dim] and "
            f"caches {tuple(k_cache.shape)}, {tuple(v_cache.shape)} equal "
            "[blocks, block_size, kv_heads, dim]"
        )
    if k_cache.stride() != v_cache.stride() or k_cache.dtype != v_cache.dtype:
        raise ValueError("paged_attention: k_cache and v_cache must share strides and dtype")
    num_heads, num_kv_heads = query.shape[1], k_cache.shape[2]
    if query.shape[2] != k_cache.shape[3] or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"paged_attention: {num_heads} query heads of dim {query.shape[2]} do not fit "
            f"{num_kv_heads} kv heads of dim {k_cache.shape[3]}"
        )
    if query.dtype != k_cache.dtype:
        raise ValueError(f"paged_attention: query is {query.dtype}, cache is {k_cache.dtype}")
    return num_heads // num_kv_heads


def on_device(device: torch.device, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Batch metadata on the kernel's device (a no-op when it is already there)."""
    return tuple(t.to(device, non_blocking=True) for t in tensors)
