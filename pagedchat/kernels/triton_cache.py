"""Triton kernels that write the paged KV cache: store-KV and copy-on-write block copies.

Same signatures and semantics as ``pagedchat.kernels.reference``, int8 caches included: a
row stored in one is byte for byte the row ``kv_int8.quantize`` makes (the same float32
operations in the same order, division and rounding to nearest even included). Importing
this module needs Triton; on CPU it only runs under ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedchat.kernels.kv_int8 import SCALE_BYTES
from pagedchat.kernels.triton_utils import check_caches


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_cb, stride_ct, stride_ch, stride_cd,
    HEAD_DIM: tl.constexpr, ROW: tl.constexpr, ROW_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    # One program per token: its whole row of kv_heads * head_dim elements for K and V.
    # ROW need not be a power of two (3 heads * 64 = 192), hence ROW_PAD and the mask.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    j = tl.arange(0, ROW_PAD)
    mask = j < ROW
    head = j // HEAD_DIM
    dim = j % HEAD_DIM
    dst = ((slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_ct
           + head * stride_ch + dim * stride_cd)
    k = tl.load(key_ptr + token * stride_kt + head * stride_kh + dim * stride_kd, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + head * stride_vh + dim * stride_vd, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _round_half_even(y):
    """``y`` rounded to the nearest integer, ties to even, as torch.round does (exact for
    the magnitudes of a quantized value)."""
    r = tl.floor(y + 0.5)
    tie = (r - y) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def _quantize_rows(src_ptr, src_offsets, dst_ptr, dst_rows, d, mask, stride_cd,
                   HEAD_DIM: tl.constexpr):
    """One token's heads ``[heads, head_dim]`` from ``src_ptr + src_offsets`` as int8 values
    and a float16 scale per head (``kv_int8.quantize``), at ``dst_ptr + dst_rows`` (``d``:
    the positions along a head)."""
    x = tl.load(src_ptr + src_offsets, mask=mask, other=0.0).to(tl.float32)
    scale = (tl.max(tl.abs(x), 1) * (1.0 / 127.0)).to(tl.float16)
    wide = scale.to(tl.float32)
    ones = tl.full(wide.shape, 1.0, tl.float32)
    inverse = tl.where(wide > 0, tl.math.div_rn(ones, tl.where(wide > 0, wide, 1.0)), 0.0)
    q = _round_half_even(x * inverse[:, None])
    q = tl.minimum(tl.maximum(q, -127.0), 127.0).to(tl.int8)
    tl.store(dst_ptr + dst_rows[:, None] + d[None, :] * stride_cd, q, mask=mask)
    head_mask = tl.max(mask.to(tl.int32), 1) > 0
    scale_ptr = (dst_ptr + dst_rows + HEAD_DIM * stride_cd).to(tl.pointer_type(tl.float16))
    tl.store(scale_ptr, scale, mask=head_mask)


@triton.jit
def _store_kv8_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_cb, stride_ct, stride_ch, stride_cd,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, KV_HEADS: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    # One program per token: every head of its K and V quantized and stored with its scale.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, KV_HEADS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    mask = (h < KV_HEADS)[:, None] & (d < HEAD_DIM)[None, :]
    rows = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_ct + h * stride_ch
    _quantize_rows(key_ptr, token * stride_kt + h[:, None] * stride_kh + d[None, :] * stride_kd,
                   k_cache_ptr, rows, d, mask, stride_cd, HEAD_DIM)
    _quantize_rows(value_ptr,
                   token * stride_vt + h[:, None] * stride_vh + d[None, :] * stride_vd,
                   v_cache_ptr, rows, d, mask, stride_cd, HEAD_DIM)


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write ``key``/``value`` rows ``[num_tokens, num_kv_heads, head_dim]`` into their slots,
    K and V in one launch, quantized where the caches hold int8 rows. A slot of -1 skips
    the row (padding)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    check_caches(k_cache, v_cache, "store_kv")
    int8 = k_cache.dtype == torch.int8
    cache_head_dim = head_dim + (SCALE_BYTES if int8 else 0)
    if value.shape != key.shape or tuple(k_cache.shape[2:]) != (num_kv_heads, cache_head_dim):
        raise ValueError(
            f"store_kv: key {tuple(key.shape)}, value {tuple(value.shape)} do not fit "
            f"a cache of shape {tuple(k_cache.shape)}")
    if int8:
        _store_kv8_kernel[(num_tokens,)](
            key, value, k_cache, v_cache, slot_mapping.to(key.device), *key.stride(),
            *value.stride(), *k_cache.stride(), HEAD_DIM=head_dim,
            HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)), KV_HEADS=num_kv_heads,
            KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads), BLOCK_SIZE=k_cache.shape[1])
        return
    if key.dtype != k_cache.dtype:
        # Cast here, not in the kernel: torch rounds to nearest even, and so matches the
        # reference bit for bit, where the Triton interpreter truncates float32 -> bfloat16.
        key, value = key.to(k_cache.dtype), value.to(k_cache.dtype)
    row = num_kv_heads * head_dim
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping.to(key.device), *key.stride(),
        *value.stride(), *k_cache.stride(), HEAD_DIM=head_dim, ROW=row,
        ROW_PAD=triton.next_power_of_2(row), BLOCK_SIZE=k_cache.shape[1])


@triton.jit
def _copy_blocks_kernel(k_ptrs, v_ptrs, dtype_carrier_ptr, block_mapping_ptr, block_numel,
                        CHUNK: tl.constexpr):
    # Grid: (layer, pair, chunk of a block). The layers' caches are separate tensors, so
    # their base addresses come from pointer tables; that keeps one launch for the whole step.
    layer = tl.program_id(0)
    pair = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(2)
    elem_ptr = tl.pointer_type(dtype_carrier_ptr.dtype.element_ty)
    k_base = tl.load(k_ptrs + layer).to(elem_ptr)
    v_base = tl.load(v_ptrs + layer).to(elem_ptr)
    src = tl.load(block_mapping_ptr + 2 * pair).to(tl.int64) * block_numel
    dst = tl.load(block_mapping_ptr + 2 * pair + 1).to(tl.int64) * block_numel
    off = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = off < block_numel
    tl.store(k_base + dst + off, tl.load(k_base + src + off, mask=mask), mask=mask)
    tl.store(v_base + dst + off, tl.load(v_base + src + off, mask=mask), mask=mask)


_COPY_CHUNK = 1024


def copy_blocks(k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                block_mapping: torch.Tensor) -> None:
    """The reference's copy-on-write in one launch for every layer; every cache must be
    contiguous and share shape and dtype (they come from one allocator)."""
    if block_mapping.numel() == 0 or not k_caches:
        return
    first = k_caches[0]
    for k_cache, v_cache in zip(k_caches, v_caches, strict=True):
        check_caches(k_cache, v_cache, "copy_blocks")
        if k_cache.shape != first.shape or k_cache.dtype != first.dtype:
            raise ValueError("copy_blocks: every layer's cache must share shape and dtype")
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("copy_blocks: caches must be contiguous")
    device = first.device
    k_ptrs = torch.tensor([c.data_ptr() for c in k_caches], dtype=torch.int64, device=device)
    v_ptrs = torch.tensor([c.data_ptr() for c in v_caches], dtype=torch.int64, device=device)
    mapping = block_mapping.to(device=device, dtype=torch.int64).contiguous()
    block_numel = first[0].numel()
    grid = (len(k_caches), mapping.shape[0], triton.cdiv(block_numel, _COPY_CHUNK))
    _copy_blocks_kernel[grid](k_ptrs, v_ptrs, first, mapping, block_numel, CHUNK=_COPY_CHUNK)

