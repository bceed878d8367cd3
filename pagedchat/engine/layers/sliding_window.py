"""Sliding-window attention through the ordinary paged-attention kernel.

A query at position ``p`` of a local layer reads the keys at ``p - window + 1 .. p``.
Every backend's kernel reads a sequence's first ``context_len`` tokens through its block
table, causally; so each query row becomes a sequence of its own, with one query and a
table of single-token blocks (the cache seen with block size 1) that lists exactly the
slots of its window. Decodes, prefill chunks and mixed batches all take this one form,
and what a local layer reads is never outside its window.
"""

from __future__ import annotations

import torch

from pagedchat.engine.layers.attention import AttentionMetadata


def window_metadata(meta: AttentionMetadata, positions: torch.Tensor, window: int,
                    block_size: int) -> AttentionMetadata:
    """The step's metadata for a local layer: one row per query, reading its window's
    slots through ``meta.block_tables`` (the local layers' tables). Built once per step
    and shared by every local layer."""
    device = positions.device
    num_rows = positions.shape[0]
    q_lens = meta.query_start_loc[1:] - meta.query_start_loc[:-1]
    row_seq = torch.repeat_interleave(
        torch.arange(q_lens.shape[0], device=device), q_lens.long())
    lens = (positions + 1).clamp(max=window)
    width = int(lens.max()) if num_rows else 1
    first = positions + 1 - lens
    pos = first.unsqueeze(1) + torch.arange(width, device=device).unsqueeze(0)
    valid = pos <= positions.unsqueeze(1)
    pos = torch.minimum(pos, positions.unsqueeze(1))
    tables = meta.block_tables.long()[row_seq]
    blocks = tables.gather(1, torch.div(pos, block_size, rounding_mode="floor"))
    slots = (blocks * block_size + pos % block_size).masked_fill_(~valid, -1)
    return AttentionMetadata(
        slot_mapping=meta.slot_mapping,
        block_tables=slots.to(torch.int32),
        context_lens=lens.to(torch.int32),
        query_start_loc=torch.arange(num_rows + 1, dtype=torch.int32, device=device),
        max_query_len=1,
        max_context_len=width,
    )


def single_token_blocks(cache: torch.Tensor) -> torch.Tensor:
    """``cache`` ``[blocks, block_size, heads, dim]`` as ``[slots, 1, heads, dim]``: the
    view the window's slot tables index."""
    return cache.view(-1, 1, *cache.shape[2:])
