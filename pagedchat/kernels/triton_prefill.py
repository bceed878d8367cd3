"""PagedAttention prefill in Triton: one program per (sequence, tile of query rows, query
head), causal over the cached prefix and the chunk itself, K/V gathered token by token
through the block table. Same semantics as ``pagedchat.kernels.reference.paged_attention``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedchat.kernels.triton_utils import (
    attend_tile,
    attention_call,
    load_queries,
    softmax_start,
    store_output,
)


@triton.jit
def _prefill_kernel(
    # what attention_call's args give, in its order: tensors, the base-2 scale, strides
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    query_start_loc_ptr, scale_log2,
    stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
    stride_cb, stride_ct, stride_ch, stride_cd, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV8: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
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
    mask = r_mask[:, None] & d_mask[None, :]
    q = load_queries(
        q_ptr, q_rows[:, None] * stride_qt + head * stride_qh + d[None, :] * stride_qd, mask,
        UPCAST)

    m_i, l_i, acc = softmax_start(BLOCK_M, HEAD_DIM_PAD)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    # Keys after the last row of this tile are masked for every row: stop before them.
    hi = tl.minimum(context_len, context_len - q_len + (m_tile + 1) * BLOCK_M)
    n = tl.arange(0, BLOCK_N)
    for start in range(0, hi, BLOCK_N):
        tok = start + n
        valid = tok < hi
        causal = valid[None, :] & (tok[None, :] <= q_pos[:, None])
        m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table, tok,
                                    valid, causal, kv_head, d, d_mask, scale_log2, stride_cb,
                                    stride_ct, stride_ch, stride_cd, BLOCK_SIZE, HEAD_DIM,
                                    HEAD_DIM_PAD, KV8, DOT_PRECISION)

    store_output(
        out_ptr, q_rows[:, None] * stride_ot + head * stride_oh + d[None, :] * stride_od, mask,
        l_i, acc)


def paged_attention_prefill(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, context_lens: torch.Tensor,
                            query_start_loc: torch.Tensor, scale: float, *, max_query_len: int,
                            out: torch.Tensor | None = None, block_m: int | None = None,
                            block_n: int | None = None) -> torch.Tensor:
    """Prefill attention: a chunk of queries per sequence, causal over prefix and chunk."""
    call = attention_call(query, k_cache, v_cache, block_tables, context_lens, query_start_loc,
                          scale, out)
    num_seqs = block_tables.shape[0]
    if num_seqs == 0 or query.shape[0] == 0 or max_query_len == 0:
        return call.out
    if block_m is None:
        cap = 32 if query.dtype == torch.float32 else 64
        block_m = min(cap, max(16, triton.next_power_of_2(max_query_len)))
    if block_n is None:
        block_n = 32
    grid = (num_seqs, triton.cdiv(max_query_len, block_m), query.shape[1])
    _prefill_kernel[grid](*call.args, **call.constexprs, BLOCK_M=block_m, BLOCK_N=block_n)
    return call.out
