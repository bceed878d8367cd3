"""EngineStats, built from the scheduler and the block manager's public face: one group
forked into two samples that share their prompt's blocks, then swapped out."""

from __future__ import annotations

from pagedchat.engine.block_manager import BlockManager
from pagedchat.engine.config import EngineConfig
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.engine.scheduler import Scheduler
from pagedchat.engine.sequence import SequenceGroup
from pagedchat.engine.stats import engine_stats


def test_a_forked_group_then_swapped_out():
    bm = BlockManager(8, 4, num_host_blocks=6)
    scheduler = Scheduler(EngineConfig(block_size=4, max_model_len=64), bm)
    group = SequenceGroup("a", None, list(range(10)), SamplingParams(n=2, max_tokens=4))
    scheduler.add(group)
    [item] = scheduler.schedule().scheduled
    item.seq.num_computed_tokens += item.num_new_tokens
    bm.cache_full_blocks(item.seq)
    group.seqs = [item.seq, scheduler.fork(item.seq, 1)]
    stats = engine_stats(scheduler, "int8")
    assert (stats.total_blocks, stats.used_blocks, stats.free_blocks, stats.cached_blocks) == (
        8, 3, 5, 0)
    assert stats.pool == ["shared"] * 3 + ["free"] * 5
    assert (stats.shared_blocks, stats.saved_blocks) == (3, 3)
    assert (stats.live_tokens, stats.empty_slots) == (10, 2)
    assert stats.owners == {0: ["a"], 1: ["a"], 2: ["a"]}
    [first, second] = stats.block_tables
    assert [(e.physical, e.filled, e.ref_count, e.cached, e.shared) for e in first.blocks] == [
        (0, 4, 2, True, True), (1, 4, 2, True, True), (2, 2, 2, False, True)]
    assert second.seq_index == 1 and second.blocks == first.blocks
    [sharing] = stats.groups
    assert (sharing.num_seqs, sharing.blocks_without_sharing, sharing.blocks_held) == (2, 6, 3)
    assert stats.kv_cache_dtype == "int8" and stats.num_running == 1
    bm.swap_out(group.seqs)
    stats = engine_stats(scheduler)
    assert stats.host_blocks_used == 3 and stats.swapped_out == 3
    assert stats.pool == ["cached", "cached", "free", "free", "free", "free", "free", "free"]
    assert (stats.free_blocks, stats.cached_blocks, stats.used_blocks) == (6, 2, 0)
