"""Sliding-window attention through the ordinary paged-attention kernel.

A query at position ``p`` of a local layer reads the keys at ``p - window + 1 .. p``. Every
kernel reads a sequence's first ``context_len`` tokens through its block table, causally; so
each query row becomes a sequence of its own, with one query and a table of single-token
blocks (the cache seen with block size 1) listing exactly its window's slots. Decodes,
prefill chunks and mixed batches all take this form, and a local layer never reads outside
its window (blocks before it may be back in the pool, their table entries holes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedchat.engine.layers.attention import AttentionMetadata


@dataclass
class WindowRows:
    """Which positions each query row of a step reads: the same for every local group."""

    row_seq: torch.Tensor  # [rows] the sequence of each query row
    positions: torch.Tensor  # [rows, width] the positions read, clamped to the query's own
    valid: torch.Tensor  # [rows, width] which of them are inside the window
    lens: torch.Tensor  # [rows] how many positions each row reads
    width: int


def window_rows(meta: AttentionMetadata, positions: torch.Tensor, window: int) -> WindowRows:
    """The step's window positions per query row, built once per step."""
    device = positions.device
    q_lens = meta.query_start_loc[1:] - meta.query_start_loc[:-1]
    row_seq = torch.repeat_interleave(
        torch.arange(q_lens.shape[0], device=device), q_lens.long())
    lens = (positions + 1).clamp(max=window)
    width = int(lens.max()) if positions.shape[0] else 1
    first = positions + 1 - lens
    pos = first.unsqueeze(1) + torch.arange(width, device=device).unsqueeze(0)
    valid = pos <= positions.unsqueeze(1)
    pos = torch.minimum(pos, positions.unsqueeze(1))
    return WindowRows(row_seq, pos, valid, lens, width)


def window_metadata(rows: WindowRows, meta: AttentionMetadata,
                    block_size: int) -> AttentionMetadata:
    """One local group's metadata: one row per query, reading its window's slots through
    ``meta.block_tables`` (the group's tables); K/V stored through ``meta``'s slots."""
    tables = meta.block_tables.long()[rows.row_seq]
    blocks = tables.gather(1, torch.div(rows.positions, block_size, rounding_mode="floor"))
    slots = (blocks * block_size + rows.positions % block_size).masked_fill_(~rows.valid, -1)
    num_rows = rows.lens.shape[0]
    return AttentionMetadata(
        slot_mapping=meta.slot_mapping,
        block_tables=slots.to(torch.int32),
        context_lens=rows.lens.to(torch.int32),
        query_start_loc=torch.arange(num_rows + 1, dtype=torch.int32,
                                     device=rows.lens.device),
        max_query_len=1,
        max_context_len=rows.width,
    )


def single_token_blocks(cache: torch.Tensor) -> torch.Tensor:
    """``cache`` ``[blocks, block_size, heads, dim]`` as ``[slots, 1, heads, dim]``: the
    view the window's slot tables index."""
    return cache.view(-1, 1, *cache.shape[2:])
