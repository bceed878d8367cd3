"""What the Triton kernel modules share: whether Triton interprets, device and shape checks of
the attention inputs, the dot settings that keep float32 exact, the arguments both attention
kernels take, and their inner step over a tile of cached tokens. An int8 cache
(``kv_int8.py``) is de-quantized in registers as a tile is read."""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from pagedchat.kernels.kv_int8 import SCALE_BYTES


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
            "imported to run on CPU; use the torch reference kernels instead")


def dot_settings(dtype: torch.dtype) -> tuple[bool, str]:
    """(UPCAST, DOT_PRECISION): float32 must not go through TF32 to match the reference."""
    upcast = dtype == torch.float32 or INTERPRETED
    return upcast, ("ieee" if upcast else "tf32")


def check_caches(k_cache: torch.Tensor, v_cache: torch.Tensor, what: str) -> None:
    """K and V caches ``[blocks, block_size, kv_heads, dim]`` of one shape, strides and
    dtype, where the kernels can run."""
    check_device(k_cache, what)
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"{what}: caches must be [num_blocks, block_size, num_kv_heads, "
                         f"head_dim] and equal: got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    if k_cache.stride() != v_cache.stride() or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"{what}: k_cache and v_cache must share strides and dtype")


def check_attention_inputs(query: torch.Tensor, k_cache: torch.Tensor,
                           v_cache: torch.Tensor) -> int:
    """The query heads per KV head, after checking shapes, strides, types and device."""
    check_device(query, "paged_attention")
    check_caches(k_cache, v_cache, "paged_attention")
    if query.dim() != 3:
        raise ValueError(f"paged_attention: query {tuple(query.shape)} must be [tokens, heads, "
                         "dim]")
    int8 = k_cache.dtype == torch.int8
    num_heads, num_kv_heads = query.shape[1], k_cache.shape[2]
    cache_head_dim = k_cache.shape[3] - (SCALE_BYTES if int8 else 0)
    if query.shape[2] != cache_head_dim or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"paged_attention: {num_heads} query heads of dim {query.shape[2]} do not fit "
            f"{num_kv_heads} kv heads of dim {cache_head_dim}")
    if int8 and (k_cache.stride(3) != 1 or cache_head_dim % 2):
        raise ValueError("paged_attention: int8 rows must be contiguous, of an even head_dim")
    if not int8 and query.dtype != k_cache.dtype:
        raise ValueError(f"paged_attention: query is {query.dtype}, cache is {k_cache.dtype}")
    return num_heads // num_kv_heads


def on_device(device: torch.device, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Batch metadata on the kernel's device (a no-op when it is already there)."""
    return tuple(t.to(device, non_blocking=True) for t in tensors)


class AttentionCall(NamedTuple):
    """One call's checked inputs as both attention kernels take them, each kernel's own after
    them: ``args`` (output, query, caches, batch metadata, the scale in base 2, their strides)
    and ``constexprs`` (GROUP, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, UPCAST, DOT_PRECISION, KV8)."""

    out: torch.Tensor
    query_start_loc: torch.Tensor  # on the kernel's device
    args: tuple
    constexprs: dict[str, object]


def attention_call(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_tables: torch.Tensor, context_lens: torch.Tensor,
                   query_start_loc: torch.Tensor, scale: float,
                   out: torch.Tensor | None, window: int | None = None) -> AttentionCall:
    """Check the inputs, move the batch metadata to the query's device and allocate ``out``
    where not given. The kernels take ``window`` as the most keys a query reads (no window:
    the largest int32)."""
    group = check_attention_inputs(query, k_cache, v_cache)
    block_tables, context_lens, query_start_loc = on_device(
        query.device, block_tables, context_lens, query_start_loc)
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device) if out is None else out
    upcast, precision = dot_settings(query.dtype)
    head_dim = query.shape[2]
    args = (out, query, k_cache, v_cache, block_tables, context_lens, query_start_loc,
            scale * LOG2E, *query.stride(), *out.stride(), *k_cache.stride(),
            block_tables.stride(0), window or 2**31 - 1)
    constexprs = dict(GROUP=group, HEAD_DIM=head_dim,
                      HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
                      BLOCK_SIZE=k_cache.shape[1], UPCAST=upcast, DOT_PRECISION=precision,
                      KV8=k_cache.dtype == torch.int8)
    return AttentionCall(out, query_start_loc, args, constexprs)


@triton.jit
def load_queries(q_ptr, offsets, mask, UPCAST: tl.constexpr):
    """The query rows at ``q_ptr + offsets``, in float32 where the dots run in it."""
    q = tl.load(q_ptr + offsets, mask=mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    return q


@triton.jit
def softmax_start(ROWS: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """Online softmax before its first tile: running max, sum and output of each row."""
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM_PAD], tl.float32)
    return m_i, l_i, acc


@triton.jit
def store_output(out_ptr, offsets, mask, l_i, acc):
    """Each row's output ``acc / l_i`` (zero for a row that saw no token) at ``out_ptr +
    offsets``, in the output's dtype."""
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_int8_rows(cache_ptr, row, valid, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, like):
    """The int8 rows at ``cache_ptr + row`` ``[tokens]`` as ``[tokens, HEAD_DIM_PAD]`` in
    ``like``'s dtype, each multiplied by its float16 scale (``HEAD_DIM`` bytes in). A row is
    read as 16-bit pairs, the widest its alignment allows (``head_dim + 2`` bytes apart),
    and the pairs' bytes split in registers."""
    half = tl.arange(0, HEAD_DIM_PAD // 2)
    pair_ptr = (cache_ptr + row[:, None]).to(tl.pointer_type(tl.int16)) + half[None, :]
    pairs = tl.load(pair_ptr, mask=valid[:, None] & (half < HEAD_DIM // 2)[None, :], other=0)
    low = (pairs << 8) >> 8  # the first byte of each pair, sign-extended (little-endian)
    high = pairs >> 8
    values = tl.interleave(low, high).to(tl.float32)
    scale = tl.load((cache_ptr + row + HEAD_DIM).to(tl.pointer_type(tl.float16)), mask=valid,
                    other=0.0)
    return (values * scale.to(tl.float32)[:, None]).to(like.dtype)


@triton.jit
def attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table, tok, valid, mask, kv_head,
                d, d_mask, scale_log2, stride_cb, stride_ct, stride_ch, stride_cd,
                BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                KV8: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One step of online softmax (base 2, float32) over the cached tokens ``tok`` (those
    ``valid`` read through the block ``table``): ``q``'s rows score them, scores outside
    ``mask`` dropped, and the running max ``m_i``, sum ``l_i`` and output ``acc`` come back
    updated. K and V are read in ``q``'s dtype; int8 rows are contiguous (``stride_cd`` 1)."""
    block = tl.load(table + tok // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    row = block * stride_cb + (tok % BLOCK_SIZE) * stride_ct + kv_head * stride_ch
    if KV8:
        k_t = tl.trans(load_int8_rows(k_cache_ptr, row, valid, HEAD_DIM, HEAD_DIM_PAD, q))
        v = load_int8_rows(v_cache_ptr, row, valid, HEAD_DIM, HEAD_DIM_PAD, q)
    else:
        k_mask = valid[None, :] & d_mask[:, None]
        v_mask = valid[:, None] & d_mask[None, :]
        k_t = tl.load(k_cache_ptr + row[None, :] + d[:, None] * stride_cd, mask=k_mask,
                      other=0.0).to(q.dtype)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :] * stride_cd, mask=v_mask,
                    other=0.0).to(q.dtype)
    s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * scale_log2
    s = tl.where(mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row that has seen no key yet (its window begins in a later tile) keeps zeros
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc
