"""Random paged batches shared by the kernel tests: K/V of each sequence in shuffled
blocks of a NaN-filled pool, so a read outside a context shows up as NaN."""

from __future__ import annotations

import torch

from pagedchat.engine.blocks import HOLE
from pagedchat.kernels import reference as ref
from pagedchat.kernels.kv_int8 import SCALE_BYTES

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, expected: torch.Tensor) -> float:
    """max |out - expected| / max |expected|; NaN anywhere in ``out`` gives inf."""
    if expected.numel() == 0:
        return 0.0
    if not bool(torch.isfinite(out).all()):
        return float("inf")
    diff = (out.float() - expected.float()).abs().max()
    return float(diff / expected.float().abs().max().clamp_min(1e-30))


def paged_batch(
    context_lens: list[int],
    query_lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int,
    kv_dtype: torch.dtype | None = None,
) -> dict:
    """Random K/V for each sequence's context, in shuffled blocks of a NaN pool. With
    ``kv_dtype`` int8 the caches hold int8 rows (kv_int8.py) whose unused slots have a NaN
    scale; the same random K/V as without it."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks stay NaN
    perm = torch.randperm(num_blocks, generator=gen)
    width = max(blocks_per_seq, default=0) + 2  # -1 padding after every table
    tables = torch.full((len(context_lens), width), -1, dtype=torch.int32)
    slots, used = [], 0
    for i, (ctx, nb) in enumerate(zip(context_lens, blocks_per_seq, strict=True)):
        tables[i, :nb] = perm[used : used + nb].to(torch.int32)
        used += nb
        slots += [int(tables[i, t // block_size]) * block_size + t % block_size for t in range(ctx)]
    if kv_dtype == torch.int8:
        shape = (num_blocks, block_size, num_kv_heads, head_dim + SCALE_BYTES)
        k_cache = torch.zeros(shape, dtype=torch.int8)
        k_cache[..., -SCALE_BYTES:] = torch.tensor([float("nan")], dtype=torch.float16).view(
            torch.int8)
        v_cache = k_cache.clone()
    else:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        k_cache = torch.full(shape, float("nan"), dtype=dtype)
        v_cache = torch.full(shape, float("nan"), dtype=dtype)
    n = len(slots)
    key = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
    ref.store_kv(key, value, k_cache, v_cache, torch.tensor(slots, dtype=torch.int64))
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    query = torch.randn(starts[-1], num_heads, head_dim, generator=gen).to(dtype)
    batch = {
        "query": query,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_tables": tables,
        "context_lens": torch.tensor(context_lens, dtype=torch.int32),
        "query_start_loc": torch.tensor(starts, dtype=torch.int32),
    }
    return {name: t.to(DEVICE) for name, t in batch.items()}


def guarded_blocks(batch: dict, contexts: list[int], block_size: int, edge: str) -> dict:
    """``batch``'s attention operands with the pool cut to just the blocks its tables name
    (sequence 0's last, full block last) and every operand against an unreadable page
    (``guarded.at_page_edge``), the tables renamed to match."""
    from guarded import at_page_edge

    tables = batch["block_tables"]
    order = [1, 2, 0]  # sequence 0's last block, full, goes last in the pool
    named = {i: tables[i, :-(-contexts[i] // block_size)].tolist() for i in order}
    used = [block for i in order for block in named[i]]
    renamed = torch.full_like(tables, -1)
    for i in order:
        renamed[i, :len(named[i])] = torch.tensor([used.index(b) for b in named[i]])
    return {"query": at_page_edge(batch["query"], edge),
            "k_cache": at_page_edge(batch["k_cache"][used], edge),
            "v_cache": at_page_edge(batch["v_cache"][used], edge),
            "block_tables": at_page_edge(renamed, edge),
            "context_lens": at_page_edge(batch["context_lens"], edge),
            "query_start_loc": at_page_edge(batch["query_start_loc"], edge)}


def windowed(batch: dict, window: int) -> dict:
    """``batch`` as a sliding-window layer group holds it: each sequence's blocks wholly
    before its chunk's first window are holes in its table (``HOLE``), and NaN in a copy
    of the pool, so that a kernel that reads one fails."""
    batch = dict(batch)
    block_size = batch["k_cache"].shape[1]
    tables = batch["block_tables"].clone()
    caches = [batch["k_cache"].clone(), batch["v_cache"].clone()]
    starts = batch["query_start_loc"].tolist()
    for i, context in enumerate(batch["context_lens"].tolist()):
        first = max(context - (starts[i + 1] - starts[i]) - window + 1, 0)
        gone = tables[i, :first // block_size].long()
        for cache in caches:
            if cache.dtype == torch.int8:  # a NaN scale (kv_int8.py)
                cache[gone, ..., -SCALE_BYTES:] = torch.tensor(
                    [float("nan")], dtype=torch.float16).view(torch.int8)
            else:
                cache[gone] = float("nan")
        tables[i, :first // block_size] = HOLE
    batch.update(block_tables=tables, k_cache=caches[0], v_cache=caches[1])
    return batch
