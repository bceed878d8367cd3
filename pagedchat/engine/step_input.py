"""One step's inputs as flat arrays: what the scheduler decided, with no Python objects.

Built from the scheduler's output (``SchedulerOutput.step_input``) for the runner, it is all
a worker needs to run a step: under tensor parallelism, the one message rank 0 sends every
worker each step. A token's cache slot in a layer group (``engine/kv_groups.py``) is
``block_table[pos // block_size] * block_size + pos % block_size``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

# The runner keeps the final hidden state of this many prompts' last rows, one per slot;
# the block manager decides which prompt each slot holds (``blocks.KeptRows``).
KEPT_ROWS = 8


@dataclass
class StepInput:
    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_groups, num_tokens] int64
    block_tables: np.ndarray  # [num_groups, num_seqs, max_blocks] int32, -1: padding or a hole
    context_lens: np.ndarray  # [num_seqs] int32
    query_start_loc: np.ndarray  # [num_seqs + 1] int32
    sample_rows: list[int]  # rows of the flat batch whose logits are sampled (-1: kept)
    copies: list[tuple[int, int]]  # copy-on-write (src, dst) block pairs
    swap_out: list[tuple[int, int]]  # (device block, host block)
    swap_in: list[tuple[int, int]]  # (host block, device block)
    # positions in sample_rows whose requests want only the greedy token (no logprobs,
    # penalties or constraints): the runner may find it without the whole exact logits
    argmax_rows: list[int] = field(default_factory=list)
    # (position in sample_rows, slot): that row's final hidden state is kept in the slot
    keep: list[tuple[int, int]] = field(default_factory=list)
    # (position in sample_rows, slot): that row is the slot's kept state, kept by an
    # earlier step (read before this step's ``keep`` writes)
    from_kept: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class StepOutput:
    """What rank 0's runner gives back for a step: the logits of the sampled rows that are
    not argmax rows, in their order (on the CPU a view of a buffer the next step
    overwrites), the greedy token of each argmax row, in theirs, and ``failed``: the rows
    (positions in sample_rows) computed as NaN or infinity, their tokens and logits void."""

    logits: torch.Tensor  # [len(sample_rows) - len(argmax_rows), vocab]
    tokens: list[int]
    failed: list[int] = field(default_factory=list)
