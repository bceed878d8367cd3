"""KV bytes per token of context: what one sequence's blocks hold, per layer group, against
a cache that keeps every layer's K/V for every token.

The sequence is driven to each context length and the blocks its tables hold while it
computes the token at that position are counted (global and local groups, see
``engine/kv_groups.py``), times the bytes of one block of the pool. Two ways, which give
the same counts (the tests check it on a small model):

- ``run_model``: the engine itself, prefill and one decode step through the model;
- otherwise the engine's scheduler and block manager alone, on the model's own layer
  groups, block size and token budget, with no forward pass (allocation does not depend
  on the values): long contexts cost seconds instead of a long prefill.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from pagedchat.engine.block_manager import BlockManager
from pagedchat.engine.blocks import HOLE
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.engine.scheduler import Scheduler
from pagedchat.engine.sequence import Sequence, SequenceGroup

COLUMNS = ["context_tokens", "global_blocks", "local_blocks", "kv_mib", "kv_bytes_per_token",
           "full_bytes_per_token", "ratio"]
MIB = 2**20


@dataclass
class ContextMemory:
    context_tokens: int
    global_blocks: int
    local_blocks: int
    kv_mib: float
    kv_bytes_per_token: float
    full_bytes_per_token: float  # every layer's K and V for every token
    ratio: float

    def row(self) -> dict[str, object]:
        return asdict(self)


def held_blocks(bm: BlockManager, seq: Sequence) -> tuple[int, int]:
    """Blocks ``seq``'s tables hold in global groups and in local (windowed) groups."""
    counts = [0, 0]
    for window, table in zip(bm.windows, seq.block_tables, strict=True):
        counts[window is not None] += sum(1 for block_id in table if block_id != HOLE)
    return counts[0], counts[1]


def measure(engine: LLMEngine, context: int, run_model: bool) -> ContextMemory:
    """The blocks one sequence holds while it computes the token at position ``context``."""
    held = _run_engine(engine, context) if run_model else _run_scheduler(engine, context)
    runner = engine.runner
    page_bytes = runner.block_bytes
    layers = runner.kv_groups.layer_group
    per_layer_token = page_bytes / (runner.kv_groups.layers_per_page * engine.config.block_size)
    kv_bytes = sum(held) * page_bytes
    full = per_layer_token * len(layers)
    return ContextMemory(context, held[0], held[1], kv_bytes / MIB, kv_bytes / context, full,
                         kv_bytes / context / full)


def _prompt(context: int) -> list[int]:
    return [(7 * i) % 1000 + 10 for i in range(context)]


def _run_engine(engine: LLMEngine, context: int) -> tuple[int, int]:
    """Prefill ``context`` tokens, then one decode step (at position ``context``)."""
    engine.reset_prefix_cache()
    request_id = f"context-{context}"
    engine.add_request(request_id, _prompt(context),
                       SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    group = engine.scheduler.find(request_id)
    seq = group.seqs[0]
    try:
        while seq.num_computed_tokens <= context:
            engine.step()
        return held_blocks(engine.scheduler.block_manager, seq)
    finally:
        engine.abort_request(request_id)


def _run_scheduler(engine: LLMEngine, context: int) -> tuple[int, int]:
    """The same steps through a scheduler and block manager like the engine's, with a
    pool large enough for the sequence."""
    bm = engine.scheduler.block_manager
    config = engine.config
    num_blocks = bm.max_blocks(context + 1, config.max_num_batched_tokens)
    scheduler = Scheduler(replace(config, num_kv_blocks=num_blocks), BlockManager(
        num_blocks, bm.block_size, 0, bm.enable_prefix_caching, bm.windows))
    group = SequenceGroup("context", None, _prompt(context),
                          SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    scheduler.add(group)
    seq = group.seqs[0]
    while True:
        out = scheduler.schedule()
        if seq.num_computed_tokens == context:
            return held_blocks(scheduler.block_manager, seq)
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            if item.samples:
                item.seq.append_token(0, 0.0)
