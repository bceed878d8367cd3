"""PagedAttention prefill in Triton: one program per (sequence, tile of query rows, query
head), causal over the cached prefix and the chunk itself, K/V gathered token by token
through the block table. Same semantics as ``pagedchat.kernels.reference.paged_attention``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedchat.kernels.triton_utils import (
    LOG2E,
    check_attention_inputs,
    dot_settings,
    on_device,
)


@triton.jit
def _prefill_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    query_start_loc_ptr,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_cd,
    stride_bt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    m_tile = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int32)
    q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_start
    if m_tile * BLOCK_M >= q_len:
        return
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    kv_head = head // GROUP

    r = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    r_mask = r < q_len
    q_pos = context_len - q_len + r  # position of each query row in its sequence
    d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = d < HEAD_DIM
    q_rows = (q_start + r).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + d[None, :] * stride_qd,
        mask=r_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    # Keys after the last row of this tile are masked for every row: stop before them.
    hi = tl.minimum(context_len, context_len - q_len + (m_tile + 1) * BLOCK_M)
    n = tl.arange(0, BLOCK_N)
    for start in range(0, hi, BLOCK_N):
        tok = start + n
        valid = tok < hi
        block = tl.load(table + tok // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        row = block * stride_cb + (tok % BLOCK_SIZE) * stride_ct + kv_head * stride_ch
        k_mask = valid[None, :] & d_mask[:, None]
        v_mask = valid[:, None] & d_mask[None, :]
        k_t = tl.load(k_cache_ptr + row[None, :] + d[:, None] * stride_cd, mask=k_mask, other=0.0)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :] * stride_cd, mask=v_mask, other=0.0)
        if UPCAST:
            k_t = k_t.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * scale_log2
        causal = valid[None, :] & (tok[None, :] <= q_pos[:, None])
        s = tl.where(causal, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    tl.store(
        out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=r_mask[:, None] & d_mask[None, :],
    )


def paged_attention_prefill(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Prefill attention: a chunk of queries per sequence, causal over prefix and chunk."""
    group = check_attention_inputs(query, k_cache, v_cache)
    block_tables, context_lens, query_start_loc = on_device(
        query.device, block_tables, context_lens, query_start_loc
    )
    num_seqs = block_tables.shape[0]
    num_heads, head_dim = query.shape[1], query.shape[2]
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_seqs == 0 or query.shape[0] == 0 or max_query_len == 0:
        return out
    upcast, precision = dot_settings(query.dtype)
    if block_m is None:
        cap = 32 if query.dtype == torch.float32 else 64
        block_m = min(cap, max(16, triton.next_power_of_2(max_query_len)))
    if block_n is None:
        block_n = 32
    grid = (num_seqs, triton.cdiv(max_query_len, block_m), num_heads)
    _prefill_kernel[grid](
        out,
        query,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        query_start_loc,
        scale * LOG2E,
        *query.stride(),
        *out.stride(),
        *k_cache.stride(),
        block_tables.stride(0),
        GROUP=group,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        UPCAST=upcast,
        DOT_PRECISION=precision,
    )
    return out
