"""One snapshot of the engine's memory and counters, read by chat, bench and inspect."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedchat.engine.block_manager import NO_HASH, BlockManager
from pagedchat.engine.scheduler import Scheduler


@dataclass
class BlockEntry:
    logical: int
    physical: int
    filled: int
    ref_count: int
    cached: bool  # full and findable by its prefix hash
    shared: bool  # held by more than one block table


@dataclass
class SeqBlockTable:
    request_id: str
    seq_index: int
    blocks: list[BlockEntry]


@dataclass
class GroupSharing:
    """For a request with several sequences: what sharing spares it."""

    request_id: str
    num_seqs: int
    blocks_without_sharing: int
    blocks_held: int


@dataclass
class EngineStats:
    total_blocks: int
    block_size: int
    used_blocks: int
    free_blocks: int
    cached_blocks: int
    live_tokens: int
    empty_slots: int
    utilization: float
    internal_fragmentation: float
    shared_blocks: int
    saved_blocks: int
    prefix_queries: int
    prefix_hits: int
    prefix_hit_rate: float
    preemptions: int
    swapped_out: int
    swapped_in: int
    host_blocks_used: int
    num_running: int
    num_waiting: int
    num_swapped: int
    block_tables: list[SeqBlockTable] = field(default_factory=list)
    groups: list[GroupSharing] = field(default_factory=list)
    pool: list[str] = field(default_factory=list)  # per block: free | cached | used | shared
    owners: dict[int, list[str]] = field(default_factory=dict)


def snapshot(bm: BlockManager, scheduler: Scheduler) -> EngineStats:
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
            entries = []
            for logical, physical in enumerate(seq.block_table):
                fill = max(min(bs, seq.num_computed_tokens - logical * bs), 0)
                filled[physical] = max(filled.get(physical, 0), fill)
                names = owners.setdefault(physical, [])
                if group.request_id not in names:
                    names.append(group.request_id)
                block = bm.blocks[physical]
                entries.append(BlockEntry(logical, physical, fill, block.ref_count,
                                          block.hash != NO_HASH, block.ref_count > 1))
            tables.append(SeqBlockTable(group.request_id, seq.index, entries))
            held.update(seq.block_table)
            without += len(seq.block_table)
        if len(seqs) > 1:
            groups.append(GroupSharing(group.request_id, len(seqs), without, len(held)))
    pool = []
    for block in bm.blocks:
        if block.ref_count > 1:
            pool.append("shared")
        elif block.ref_count == 1:
            pool.append("used")
        elif block.block_id in bm.evictable:
            pool.append("cached")
        else:
            pool.append("free")
    used = sum(1 for state in pool if state in ("used", "shared"))
    live = sum(filled.values())
    allocated = used * bs
    return EngineStats(
        total_blocks=bm.num_blocks,
        block_size=bs,
        used_blocks=used,
        free_blocks=len(bm.free_ids),
        cached_blocks=len(bm.evictable),
        live_tokens=live,
        empty_slots=allocated - live,
        utilization=live / allocated if allocated else 0.0,
        internal_fragmentation=(allocated - live) / allocated if allocated else 0.0,
        shared_blocks=sum(1 for state in pool if state == "shared"),
        saved_blocks=sum(b.ref_count - 1 for b in bm.blocks if b.ref_count > 1),
        prefix_queries=bm.prefix_queries,
        prefix_hits=bm.prefix_hits,
        prefix_hit_rate=bm.prefix_hits / bm.prefix_queries if bm.prefix_queries else 0.0,
        preemptions=scheduler.num_preemptions,
        swapped_out=bm.swapped_out,
        swapped_in=bm.swapped_in,
        host_blocks_used=bm.host.num_blocks - bm.host.num_free,
        num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting),
        num_swapped=len(scheduler.swapped),
        block_tables=tables,
        groups=groups,
        pool=pool,
        owners=owners,
    )
