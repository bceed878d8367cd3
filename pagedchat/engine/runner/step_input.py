"""One step's inputs as flat arrays: what the scheduler decided, with no Python objects.

This is all a worker needs to run a step, so under tensor parallelism it is the one
message rank 0 sends every worker each step. For each scheduled token: its id, its
position and its cache slot (``block_table[pos // block_size] * block_size + pos %
block_size``); for each sequence: its context length and padded block table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagedchat.engine.scheduler import SchedulerOutput


@dataclass
class StepInput:
    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_tokens] int64
    block_tables: np.ndarray  # [num_seqs, max_blocks] int32, padded with -1
    context_lens: np.ndarray  # [num_seqs] int32
    query_start_loc: np.ndarray  # [num_seqs + 1] int32
    sample_rows: list[int]  # rows of the flat batch whose logits are sampled
    copies: list[tuple[int, int]]  # copy-on-write (src, dst) block pairs
    swap_out: list[tuple[int, int]]  # (device block, host block)
    swap_in: list[tuple[int, int]]  # (host block, device block)


def build_step(out: SchedulerOutput, block_size: int) -> StepInput:
    """Flatten the scheduled sequences, prefill chunks and decodes side by side."""
    token_chunks, position_chunks, slot_chunks = [], [], []
    context_lens, query_start, sample_rows = [], [0], []
    max_blocks = max(len(item.seq.block_table) for item in out.scheduled)
    tables = np.full((len(out.scheduled), max_blocks), -1, dtype=np.int32)
    for i, item in enumerate(out.scheduled):
        seq = item.seq
        start = seq.num_computed_tokens
        end = start + item.num_new_tokens
        table = np.asarray(seq.block_table, dtype=np.int64)
        tables[i, : len(table)] = table
        positions = np.arange(start, end)
        token_chunks.append(seq.token_ids[start:end])
        position_chunks.append(positions)
        slot_chunks.append(table[positions // block_size] * block_size + positions % block_size)
        context_lens.append(end)
        query_start.append(query_start[-1] + item.num_new_tokens)
        if item.samples:
            sample_rows.append(query_start[-1] - 1)
    return StepInput(
        input_ids=np.fromiter((t for chunk in token_chunks for t in chunk), dtype=np.int64),
        positions=np.concatenate(position_chunks),
        slot_mapping=np.concatenate(slot_chunks),
        block_tables=tables,
        context_lens=np.asarray(context_lens, dtype=np.int32),
        query_start_loc=np.asarray(query_start, dtype=np.int32),
        sample_rows=sample_rows,
        copies=out.copies, swap_out=out.swap_out, swap_in=out.swap_in,
    )
