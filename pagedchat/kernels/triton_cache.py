"""Triton kernels that write the paged KV cache: store-KV and copy-on-write block copies.

Same signatures and semantics as ``pagedchat.kernels.reference``. Importing this module
needs Triton; on CPU it only runs under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

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


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write ``key``/``value`` rows ``[num_tokens, num_kv_heads, head_dim]`` into their slots,
    K and V in one launch. A slot of -1 skips the row (padding)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    check_caches(k_cache, v_cache, "store_kv")
    if value.shape != key.shape or tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(
            f"store_kv: key {tuple(key.shape)}, value {tuple(value.shape)} do not fit "
            f"a cache of shape {tuple(k_cache.shape)}"
        )
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
    """Copy-on-write: for every ``(src, dst)`` row of ``block_mapping`` ``[n, 2]``, copy block
    ``src`` into block ``dst`` in every layer's K and V cache, all in one launch.

    Every cache must be contiguous and share shape and dtype (they come from one allocator).
    """
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

