"""The engine's one snapshot (EngineStats): the pool, the running groups' block tables and
the counters, read through the block manager's and the scheduler's public face."""

from __future__ import annotations

from pagedchat.engine.blocks import HOLE
from pagedchat.engine.outputs import BlockEntry, EngineStats, GroupSharing, SeqBlockTable
from pagedchat.engine.scheduler import Scheduler


def engine_stats(scheduler: Scheduler, kv_cache_dtype: str = "float32") -> EngineStats:
    """One snapshot of the pool, the running groups' block tables and the counters."""
    bm = scheduler.block_manager
    bs = bm.block_size
    filled: dict[int, int] = {}
    owners: dict[int, list[str]] = {}
    tables: list[SeqBlockTable] = []
    groups: list[GroupSharing] = []
    for group in scheduler.running:
        held: set[int] = set()
        without = 0
        seqs = group.unfinished_seqs
        for seq in seqs:
            for layer_group, table in enumerate(seq.block_tables):
                entries = []
                for logical, physical in enumerate(table):
                    if physical == HOLE:
                        continue
                    fill = max(min(bs, seq.num_computed_tokens - logical * bs), 0)
                    filled[physical] = max(filled.get(physical, 0), fill)
                    names = owners.setdefault(physical, [])
                    if group.request_id not in names:
                        names.append(group.request_id)
                    ref_count = bm.ref_count(physical)
                    entries.append(BlockEntry(logical, physical, fill, ref_count,
                                              bm.is_hashed(physical), ref_count > 1))
                    held.add(physical)
                tables.append(SeqBlockTable(group.request_id, seq.index, entries,
                                            layer_group, bm.windows[layer_group],
                                            len(table) - len(entries)))
                without += len(entries)
        if len(seqs) > 1:
            groups.append(GroupSharing(group.request_id, len(seqs), without, len(held)))
    pool = [bm.block_state(block_id) for block_id in range(bm.num_blocks)]
    used = sum(1 for state in pool if state in ("used", "shared"))
    live = sum(filled.values())
    allocated = used * bs
    return EngineStats(
        total_blocks=bm.num_blocks, block_size=bs, used_blocks=used,
        free_blocks=pool.count("free"), cached_blocks=pool.count("cached"), live_tokens=live,
        empty_slots=allocated - live, utilization=live / allocated if allocated else 0.0,
        internal_fragmentation=(allocated - live) / allocated if allocated else 0.0,
        shared_blocks=pool.count("shared"),
        saved_blocks=sum(max(bm.ref_count(block_id) - 1, 0) for block_id in range(bm.num_blocks)),
        prefix_queries=bm.prefix_queries, prefix_hits=bm.prefix_hits,
        prefix_hit_rate=bm.prefix_hits / bm.prefix_queries if bm.prefix_queries else 0.0,
        preemptions=scheduler.num_preemptions, swapped_out=bm.swapped_out,
        swapped_in=bm.swapped_in, host_blocks_used=bm.host.num_used,
        window_freed_blocks=bm.window_freed, group_windows=list(bm.windows),
        speculative=scheduler.config.speculative, draft_tokens=scheduler.draft_tokens,
        accepted_tokens=scheduler.accepted_tokens, num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting), num_swapped=len(scheduler.swapped),
        block_tables=tables, groups=groups, pool=pool, owners=owners,
        kv_cache_dtype=kv_cache_dtype)
