"""PagedAttention in Triton: a paged decode kernel (with split-K), a prefill kernel, and the
dispatch between them.

Same semantics as ``pagedchat.kernels.reference.paged_attention``. Both kernels gather K/V
token by token through the block table (block id = table[t // block_size], row
t % block_size), so the attention tile size does not depend on the cache block size.
Softmax is online (running max and sum, in base 2), always accumulated in float32.

Decode (every q_len <= 1): one program per (sequence, kv head, split) serves all the query
heads sharing that kv head, so each K/V tile is read once per group; with few sequences and
long contexts the context is split over programs ("flash decoding") and a second kernel
merges the partial results. Prefill (some q_len > 1): one program per (sequence, tile of
query rows, query head), causal over the cached prefix and the chunk itself.

The Triton interpreter (``TRITON_INTERPRET=1``) computes bfloat16 ``tl.dot`` on the raw
bit patterns (triton-lang/triton#11584), so under it every dot runs in float32."""

from __future__ import annotations

import functools

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

_MIN_TOKENS_PER_SPLIT = 256
_MAX_SPLITS = 64


@triton.jit
def _decode_kernel(
    # what attention_call's args give, in its order: tensors, the base-2 scale, strides
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    query_start_loc_ptr, scale_log2,
    stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
    stride_cb, stride_ct, stride_ch, stride_cd, stride_bt, window,
    part_acc_ptr, part_m_ptr, part_l_ptr, num_splits, tokens_per_split,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV8: tl.constexpr, GROUP_PAD: tl.constexpr, TILE_N: tl.constexpr, SPLIT: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_row = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    q_end = tl.load(query_start_loc_ptr + seq + 1).to(tl.int64)
    if q_end == q_row:  # a sequence with no query this step
        return
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    lo = split * tokens_per_split
    hi = tl.minimum(lo + tokens_per_split, context_len)
    lo = tl.maximum(lo, context_len - window)  # the query's window; table holes before it

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    mask = g_mask[:, None] & d_mask[None, :]
    q = load_queries(
        q_ptr, q_row * stride_qt + heads[:, None] * stride_qh + d[None, :] * stride_qd, mask,
        UPCAST)

    m_i, l_i, acc = softmax_start(GROUP_PAD, HEAD_DIM_PAD)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    n = tl.arange(0, TILE_N)
    for start in range(lo, hi, TILE_N):
        tok = start + n
        valid = tok < hi
        m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table, tok,
                                    valid, valid[None, :], kv_head, d, d_mask, scale_log2,
                                    stride_cb, stride_ct, stride_ch, stride_cd, BLOCK_SIZE,
                                    HEAD_DIM, HEAD_DIM_PAD, KV8, DOT_PRECISION)

    if SPLIT:
        # Partial results of this split, merged by _reduce_kernel. An empty split (past
        # the end of a short context) leaves m = -inf, l = 0, acc = 0: weight zero.
        part = (seq * (tl.num_programs(1) * GROUP) + heads).to(tl.int64) * num_splits + split
        tl.store(part_m_ptr + part, m_i, mask=g_mask)
        tl.store(part_l_ptr + part, l_i, mask=g_mask)
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM_PAD + d[None, :], acc,
                 mask=g_mask[:, None])
    else:
        store_output(
            out_ptr, q_row * stride_ot + heads[:, None] * stride_oh + d[None, :] * stride_od,
            mask, l_i, acc)


@triton.jit
def _reduce_kernel(out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, query_start_loc_ptr, num_splits,
                   stride_ot, stride_oh, stride_od, HEAD_DIM: tl.constexpr,
                   HEAD_DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_row = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    q_end = tl.load(query_start_loc_ptr + seq + 1).to(tl.int64)
    if q_end == q_row:
        return
    s = tl.arange(0, SPLITS_PAD)
    s_mask = s < num_splits
    d = tl.arange(0, HEAD_DIM_PAD)
    part = (seq * tl.num_programs(1) + head).to(tl.int64) * num_splits + s
    m = tl.load(part_m_ptr + part, mask=s_mask, other=float("-inf"))
    lse = tl.load(part_l_ptr + part, mask=s_mask, other=0.0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * HEAD_DIM_PAD + d[None, :], mask=s_mask[:, None], other=0.0)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_max)
    total = tl.sum(w * lse, 0)
    total = tl.where(total == 0.0, 1.0, total)
    out = tl.sum(w[:, None] * acc, 0) / total
    tl.store(out_ptr + q_row * stride_ot + head * stride_oh + d * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


@functools.cache
def _num_cores(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1  # the interpreter runs programs one after another: splitting only costs time


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, num_cores: int
) -> int:
    """How many programs share one (sequence, kv head) in decode: a power of two.

    Split only when the (sequence, kv head) programs cannot fill the device, and keep at
    least ``_MIN_TOKENS_PER_SPLIT`` tokens per split so the merge stays cheap."""
    programs = num_seqs * num_kv_heads
    if programs >= num_cores:
        return 1
    wanted = triton.cdiv(2 * num_cores, programs)
    splits = min(wanted, max_context_len // _MIN_TOKENS_PER_SPLIT, _MAX_SPLITS)
    return 1 if splits <= 1 else 1 << (splits.bit_length() - 1)


def paged_attention_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           query_start_loc: torch.Tensor, scale: float, *, max_context_len: int,
                           out: torch.Tensor | None = None, num_splits: int | None = None,
                           tile_n: int | None = None, window: int | None = None
                           ) -> torch.Tensor:
    """Decode attention: every sequence has at most one query row (``q_len`` 0 or 1).

    ``num_splits`` (default: ``choose_num_splits``) and ``tile_n`` (tokens per inner step)
    are tuning knobs; tests use them to reach the split-K and multi-tile paths cheaply."""
    call = attention_call(query, k_cache, v_cache, block_tables, context_lens, query_start_loc,
                          scale, out, window)
    out = call.out
    num_seqs, num_heads, num_kv_heads = block_tables.shape[0], query.shape[1], k_cache.shape[2]
    if num_seqs == 0 or query.shape[0] == 0:
        return out
    head_dim_pad = call.constexprs["HEAD_DIM_PAD"]
    if tile_n is None:  # float32 tiles take twice the registers
        tile_n = 64 if head_dim_pad <= 128 and query.dtype != torch.float32 else 32
    if num_splits is None:
        num_splits = choose_num_splits(
            num_seqs, num_kv_heads, max_context_len, _num_cores(query.device))
    tokens_per_split = triton.cdiv(triton.cdiv(max(max_context_len, 1), num_splits), tile_n)
    tokens_per_split *= tile_n
    num_splits = max(1, triton.cdiv(max_context_len, tokens_per_split))
    split = num_splits > 1
    if split:
        part_acc = torch.empty((num_seqs, num_heads, num_splits, head_dim_pad),
                               dtype=torch.float32, device=query.device)
        part_m = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32,
                             device=query.device)
        part_l = torch.empty_like(part_m)
    else:
        part_acc = part_m = part_l = out  # unused
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        *call.args, part_acc, part_m, part_l, num_splits, tokens_per_split, **call.constexprs,
        GROUP_PAD=max(16, triton.next_power_of_2(call.constexprs["GROUP"])), TILE_N=tile_n,
        SPLIT=split,
    )
    if split:
        _reduce_kernel[(num_seqs, num_heads)](
            out, part_acc, part_m, part_l, call.query_start_loc, num_splits, *out.stride(),
            HEAD_DIM=call.constexprs["HEAD_DIM"], HEAD_DIM_PAD=head_dim_pad,
            SPLITS_PAD=triton.next_power_of_2(num_splits))
    return out


@triton.jit
def _prefill_kernel(
    # what attention_call's args give, in its order: tensors, the base-2 scale, strides
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    query_start_loc_ptr, scale_log2,
    stride_qt, stride_qh, stride_qd, stride_ot, stride_oh, stride_od,
    stride_cb, stride_ct, stride_ch, stride_cd, stride_bt, window,
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
    # Keys after the last row of this tile are masked for every row: stop before them; and
    # start at its first row's window (the table may have holes before the chunk's).
    hi = tl.minimum(context_len, context_len - q_len + (m_tile + 1) * BLOCK_M)
    lo = tl.maximum(context_len - q_len + m_tile * BLOCK_M - window + 1, 0)
    n = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        tok = start + n
        valid = tok < hi
        causal = valid[None, :] & (tok[None, :] <= q_pos[:, None]) & (
            tok[None, :] > q_pos[:, None] - window)
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
                            block_n: int | None = None, window: int | None = None
                            ) -> torch.Tensor:
    """Prefill attention: a chunk of queries per sequence, causal over prefix and chunk."""
    call = attention_call(query, k_cache, v_cache, block_tables, context_lens, query_start_loc,
                          scale, out, window)
    num_seqs = block_tables.shape[0]
    if num_seqs == 0 or query.shape[0] == 0 or max_query_len == 0:
        return call.out
    if block_m is None:
        cap = 32 if query.dtype == torch.float32 else 64
        block_m = min(cap, max(16, triton.next_power_of_2(max_query_len)))
    block_n = 32 if block_n is None else block_n
    grid = (num_seqs, triton.cdiv(max_query_len, block_m), query.shape[1])
    _prefill_kernel[grid](*call.args, **call.constexprs, BLOCK_M=block_m, BLOCK_N=block_n)
    return call.out


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, context_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float, *,
                    max_query_len: int | None = None, max_context_len: int | None = None,
                    window: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The reference's paged attention (its contract, its host-side hints), written into
    ``out`` where given: the decode kernel when no sequence has more than one query row, the
    prefill kernel otherwise."""
    inputs = (query, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale)
    if max_query_len is None:
        q_lens = query_start_loc[1:] - query_start_loc[:-1]
        max_query_len = int(q_lens.max()) if q_lens.numel() else 0
    if max_query_len <= 1:
        if max_context_len is None:
            max_context_len = int(context_lens.max()) if context_lens.numel() else 0
        return paged_attention_decode(*inputs, max_context_len=max_context_len, out=out,
                                      window=window)
    return paged_attention_prefill(*inputs, max_query_len=max_query_len, out=out, window=window)
