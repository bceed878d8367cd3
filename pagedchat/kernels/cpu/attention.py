"""Paged attention on the CPU: the row-by-row kernel (attention.c) for decodes and short
chunks, the tiled kernel (prefill.c) for longer prompt chunks, torch's SDPA for the shapes
the tiled kernel does not take, the reference where no kernels are built."""

from __future__ import annotations

import functools
import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F

from pagedchat.kernels import reference
from pagedchat.kernels.cpu.build import FLOAT, INT, P, declare, kernel
from pagedchat.kernels.reference import first_key, gather_kv, write_slots

# Chunks of at least this many queries go to the chunked-prefill kernel, which reads each tile of K
# and V once for a tile of query rows (from 8 rows on it beats the row-by-row kernel).
PREFILL_MIN_QUERY_LEN = 8
_count = functools.cache(functools.partial(torch.arange, dtype=torch.int32))  # 0 .. n - 1, shared

declare({
    # ... scale, window (0: none), num_threads
    "paged_attention": (INT, [P] * 9 + [INT] * 6 + [FLOAT, INT, INT]),
    "paged_prefill": (INT, [P] * 8 + [INT] * 6 + [FLOAT, INT, INT]),
    # over int8 caches (kv_int8.py), queries and outputs of the type the name ends with
    "paged_attention_kv8": (INT, [P] * 9 + [INT] * 6 + [FLOAT, INT, INT]),
    "paged_prefill_kv8": (INT, [P] * 8 + [INT] * 6 + [FLOAT, INT, INT]),
    "paged_attention_kv8_part": (INT, [P] * 9 + [INT] * 6 + [FLOAT, INT, INT, INT])})


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, context_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float, *,
                    max_query_len: int | None = None, max_context_len: int | None = None,
                    window: int | None = None) -> torch.Tensor:
    """Same contract as :func:`pagedchat.kernels.reference.paged_attention`."""
    int8 = k_cache.dtype == torch.int8
    if int8:  # the queries' type names the kernel; the caches must be int8 on the CPU
        both = v_cache.dtype == torch.int8 and k_cache.is_cpu and v_cache.is_cpu
        attention = kernel("paged_attention_kv8", query) if both else None
    else:
        attention = kernel("paged_attention", query, k_cache, v_cache)
    if attention is None:
        return reference.paged_attention(
            query, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale,
            window=window)
    query = query.contiguous()
    out = torch.empty_like(query)
    plan = _plan(block_tables, context_lens, query_start_loc)
    if len(plan.rows):
        status = attention(
            query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
            plan.tables.data_ptr(), plan.context_lens.data_ptr(),
            plan.query_start_loc.data_ptr(), plan.rows.data_ptr(), plan.row_seqs.data_ptr(),
            len(plan.rows), plan.tables.shape[1], query.shape[1], k_cache.shape[2],
            query.shape[2], k_cache.shape[1], scale, window or 0, torch.get_num_threads())
        if status != 0:
            raise MemoryError("paged attention: out of memory for the score buffer")
    long_chunks = plan.long_chunks
    if long_chunks:
        status = kernel("paged_prefill_kv8" if int8 else "paged_prefill", query)(
            query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
            plan.tables.data_ptr(), plan.context_lens.data_ptr(),
            plan.query_start_loc.data_ptr(), plan.long_seqs.data_ptr(), len(long_chunks),
            plan.tables.shape[1], query.shape[1], k_cache.shape[2], query.shape[2],
            k_cache.shape[1], scale, window or 0, torch.get_num_threads())
        if status == 2:
            raise MemoryError("paged attention: out of memory for the transposed keys")
        if status == 0:
            long_chunks = []
    for seq, begin, end, context_len in long_chunks:
        out[begin:end] = _sdpa(query[begin:end], k_cache, v_cache, block_tables[seq],
                               context_len, scale, window)
    return out


class _Plan(NamedTuple):
    """How one step's batch splits between the row-by-row kernel (decodes, short chunks)
    and the chunked-prefill kernel or SDPA (long chunks), in the kernels' types."""

    rows: torch.Tensor  # int32: the query rows of short chunks (decodes, short prefills)
    row_seqs: torch.Tensor  # int32: the sequence of each of those rows
    tables: torch.Tensor
    context_lens: torch.Tensor
    query_start_loc: torch.Tensor
    long_chunks: list[tuple[int, int, int, int]]  # (seq, first row, end row, context len)
    long_seqs: torch.Tensor  # int32: the sequences of the long chunks


# the sets of metadata tensors a step's layers take in turn: one per layer group (Gemma 3's
# local layers read their window's tables, its global layers the whole context's)
STEP_ENTRIES = 4


def _per_step(make):
    """Memoise ``make`` on the identity of its tensor arguments (the last ``STEP_ENTRIES``
    sets): a step's layers share their group's metadata tensors, never changed in place, and
    weak references keep a freed tensor (a past step) from matching a new one's address."""
    entries: list[tuple[tuple, object]] = []

    @functools.wraps(make)
    def memoised(*tensors: torch.Tensor):
        for refs, value in entries:
            if len(refs) == len(tensors) and all(
                    ref() is tensor for ref, tensor in zip(refs, tensors, strict=True)):
                return value
        value = make(*tensors)
        entries.insert(0, (tuple(weakref.ref(tensor) for tensor in tensors), value))
        del entries[STEP_ENTRIES:]
        return value

    return memoised


@_per_step
def _slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The int64 slots to write and, when some rows are skipped (-1), the rows kept."""
    valid = slot_mapping >= 0
    return (slot_mapping.long(), None) if bool(valid.all()) else (slot_mapping[valid].long(), valid)


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Same contract as :func:`pagedchat.kernels.reference.store_kv`, with the slot check
    done once per step."""
    slots, kept = _slots(slot_mapping)
    if kept is not None:
        key, value = key[kept], value[kept]
    write_slots(key, value, k_cache, v_cache, slots)


@_per_step
def _plan(block_tables: torch.Tensor, context_lens: torch.Tensor,
          query_start_loc: torch.Tensor) -> _Plan:
    """How this step's batch splits between the row-by-row kernel and the long chunks."""
    starts, lens = query_start_loc.tolist(), context_lens.tolist()
    as_int32 = [tensor.to(torch.int32).contiguous()
                for tensor in (block_tables, context_lens, query_start_loc)]
    if starts == list(range(len(starts))):  # a decode step, a row per sequence: no search
        return _Plan(_count(len(lens)), _count(len(lens)), *as_int32, [], _count(0))
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    short = q_lens < PREFILL_MIN_QUERY_LEN
    long = (~short).nonzero().flatten().tolist()
    return _Plan(
        torch.arange(starts[-1], dtype=torch.int32)[torch.repeat_interleave(short, q_lens)],
        torch.repeat_interleave(_count(len(q_lens)), q_lens * short), *as_int32,
        [(seq, starts[seq], starts[seq + 1], lens[seq]) for seq in long],
        torch.tensor(long, dtype=torch.int32))


def _sdpa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
          block_table: torch.Tensor, context_len: int, scale: float,
          window: int | None) -> torch.Tensor:
    """A long chunk of one sequence: gather its context (from its first row's window on)
    once (de-quantized from int8 caches), then torch's fused SDPA (causal, aligned to the
    end of the context). The inputs are 4-D on purpose: with 3-D ones torch falls back to
    its slow path on the CPU."""
    q_len = q.shape[0]
    first = first_key(context_len, q_len, window)
    k, v = (gather_kv(cache, block_table, context_len, first).to(q.dtype).transpose(0, 1)
            .unsqueeze(0) for cache in (k_cache, v_cache))
    q4 = q.transpose(0, 1).unsqueeze(0)
    if q_len == context_len and window is None:
        out = F.scaled_dot_product_attention(q4, k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        q_pos = torch.arange(context_len - q_len, context_len).unsqueeze(1)
        k_pos = torch.arange(first, context_len).unsqueeze(0)
        allowed = k_pos <= q_pos
        if window is not None:
            allowed &= k_pos > q_pos - window
        out = F.scaled_dot_product_attention(q4, k, v, attn_mask=allowed, scale=scale,
                                             enable_gqa=True)
    return out[0].transpose(0, 1)
