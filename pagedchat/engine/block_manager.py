"""The KV block pool: free list, reference counts, copy-on-write, prefix cache, swap pool.

A sequence has one block table per layer group (``kv_groups.py``), indexed by the block's
position in the sequence, all drawing on this pool. In a windowed group, a block wholly
before the window of the next token to compute is never read again: it goes back to the
pool and its entry becomes ``HOLE``, so the holes are always a prefix. Every block is
referenced, cached-evictable or free (``blocks.Block``); ``prefix_cache.py`` is the half of
the class that finds and publishes full blocks by their chained hash."""

from __future__ import annotations

from collections import OrderedDict

from pagedchat.engine import kv_groups
from pagedchat.engine.blocks import (
    HOLE,
    NO_HASH,
    NO_HIT,
    Block,
    HostPool,
    KeptRows,
    PrefixHit,
    held_blocks,
)
from pagedchat.engine.prefix_cache import PrefixCache
from pagedchat.engine.sequence import Sequence
from pagedchat.engine.step_input import KEPT_ROWS


class BlockManager(PrefixCache):
    def __init__(self, num_blocks: int, block_size: int, num_host_blocks: int = 0,
                 enable_prefix_caching: bool = True,
                 windows: tuple[int | None, ...] = (None,)) -> None:
        self.block_size, self.num_blocks = block_size, num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.windows = tuple(windows)  # per layer group: its sliding window, None for global
        self.num_groups = len(self.windows)
        self.has_windows = any(w is not None for w in self.windows)
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids = list(range(num_blocks - 1, -1, -1))
        # Free ids are handed out lowest first and reused last-freed first, so blocks at or
        # above this mark were never used: how much of the pool a run needed.
        self.high_water = 0
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.hash_to_block: dict[tuple[int, int], int] = {}
        self.children: dict[tuple[int, int], set[int]] = {}
        self.unwritten: set[int] = set()
        self.pinned: list[int] = []  # blocks held until the step's copies are taken
        self.kept_rows = KeptRows(KEPT_ROWS)
        self.host = HostPool(num_host_blocks)
        self.pending_copies: list[tuple[int, int]] = []
        self.prefix_queries, self.prefix_hits = 0, 0
        self.swapped_out, self.swapped_in = 0, 0
        self.window_freed = 0  # blocks that went back to the pool by sliding out of a window

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: free plus cached-evictable."""
        return len(self.free_ids) + len(self.evictable)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def window_start(self, group: int, position: int) -> int:
        """The first block of ``group`` that a query at ``position`` reads (0 for a group
        without a window): blocks before it are never read again once ``position`` is
        the next token to compute."""
        window = self.windows[group]
        return 0 if window is None else max(position - window + 1, 0) // self.block_size

    def max_blocks(self, num_tokens: int, chunk: int) -> int:
        """:func:`.kv_groups.max_blocks` for this pool's groups and block size."""
        return kv_groups.max_blocks(self.windows, self.block_size, num_tokens, chunk)

    def ref_count(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count

    def block_state(self, block_id: int) -> str:
        """``shared`` (in several tables), ``used`` (in one), ``cached`` or ``free``."""
        ref_count = self.blocks[block_id].ref_count
        if ref_count:
            return "shared" if ref_count > 1 else "used"
        return "cached" if block_id in self.evictable else "free"

    def is_hashed(self, block_id: int) -> bool:  # a full block others can find by its prefix
        return self.blocks[block_id].hash != NO_HASH

    def blocks_needed(self, seq: Sequence, num_new_tokens: int, hit: PrefixHit = NO_HIT,
                      refs: dict[int, int] | None = None) -> int:
        """Fresh blocks ``allocate_slots`` would pop for ``seq`` (cached hits not counted).
        ``refs`` (block id -> ref count) counts several sequences sharing blocks as if they
        were allocated one after another."""
        refs = refs if refs is not None else {}
        bs = self.block_size
        computed = seq.num_computed_tokens + hit.num_tokens
        count = self.blocks_for(computed + num_new_tokens)
        have = len(seq.block_tables[0]) if seq.block_tables else 0
        have += hit.num_blocks
        need = 0
        for group in range(self.num_groups):
            need += max(count - max(have, self.window_start(group, computed)), 0)
        if num_new_tokens and computed % bs and seq.block_tables:
            for table in seq.block_tables:
                last = table[-1]
                ref_count = refs.get(last, self.blocks[last].ref_count)
                if ref_count > 1:
                    need += 1
                    refs[last] = ref_count - 1
        return need

    def evictable_taken(self, cached: set[int] | list[int]) -> int:
        """How many of these cached blocks would leave the evictable list when taken."""
        return sum(1 for block_id in set(cached) if self.blocks[block_id].ref_count == 0)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, hit: PrefixHit = NO_HIT) -> bool:
        """Make room for ``num_new_tokens`` more tokens of ``seq``; False (nothing changed) if
        blocks ran out. Takes the prefix ``hit``'s blocks first (their tokens count as
        computed), copies a shared, partly filled last block before it is written
        (copy-on-write), then appends fresh blocks (``HOLE`` before a windowed group's window)."""
        need = self.blocks_needed(seq, num_new_tokens, hit) + self.evictable_taken(hit.block_ids())
        if need > self.num_free_blocks:
            return False
        if not seq.block_tables:
            if self.enable_prefix_caching:
                self.prefix_queries += seq.num_tokens
            seq.block_tables = [[] for _ in self.windows]
        if hit.kept_slot is not None:
            self.kept_rows.use(hit.kept_slot)
        if hit.num_tokens:
            self.prefix_hits += hit.num_tokens
            for table, cached in zip(seq.block_tables, hit.tables, strict=True):
                for block_id in cached:
                    if block_id != HOLE:
                        self._take(block_id)
                    table.append(block_id)
            seq.block_hashes.extend(hit.hashes)
            # A tail's source is held until the step's copies are taken, so no allocation
            # of this schedule can hand it out before it is copied; every group's is held
            # before any copy's block is popped (a pop may evict a cached block).
            for source in hit.tail:
                self._take(source)
                self.pinned.append(source)
            for group, (table, source) in enumerate(zip(seq.block_tables, hit.tail)):
                fresh = self._pop_free(group)
                self.pending_copies.append((source, fresh))
                table.append(fresh)
            seq.num_computed_tokens = hit.num_tokens
        computed = seq.num_computed_tokens
        count = self.blocks_for(computed + num_new_tokens)
        for group, table in enumerate(seq.block_tables):
            if num_new_tokens and computed % self.block_size:
                last = table[-1]
                if self.blocks[last].ref_count > 1:
                    fresh = self._pop_free(group)
                    self.blocks[last].ref_count -= 1
                    self.pending_copies.append((last, fresh))
                    table[-1] = fresh
            start = self.window_start(group, computed)
            while len(table) < count:
                table.append(HOLE if len(table) < start else self._pop_free(group))
        return True

    def slide(self, seq: Sequence) -> int:
        """Give back the blocks of ``seq``'s windowed groups that lie wholly before the
        window of its next token (``num_computed_tokens``); call it only once the steps
        that read them have run. Returns how many went back to the pool."""
        returned = 0
        for group, table in enumerate(seq.block_tables):
            index = min(self.window_start(group, seq.num_computed_tokens), len(table)) - 1
            while index >= 0 and table[index] != HOLE:
                returned += self._release(table[index])
                table[index] = HOLE
                index -= 1
        self.window_freed += returned
        return returned

    def truncate(self, seq: Sequence) -> int:
        """Give back the blocks past ``seq``'s computed tokens: after a speculative step,
        those only its rejected draft tokens were written to (fresh blocks of its own, never
        shared or cached). Returns how many went back to the pool."""
        keep = self.blocks_for(seq.num_computed_tokens)
        returned = 0
        for table in seq.block_tables:
            while len(table) > keep:
                block_id = table.pop()
                if block_id != HOLE:
                    returned += self._release(block_id)
        return returned

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` shares every block of ``parent`` (ref counts go up, nothing is copied)."""
        child.block_tables = [list(table) for table in parent.block_tables]
        for table in child.block_tables:
            for block_id in table:
                if block_id != HOLE:
                    self.blocks[block_id].ref_count += 1

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references, tail first, so its tail is evicted before its head."""
        for table in seq.block_tables:
            for block_id in reversed(table):
                if block_id != HOLE:
                    self._release(block_id)
        seq.block_tables = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0
        for table in seq.cpu_block_tables:
            for block_id in table:
                if block_id != HOLE:
                    self.host.release(block_id)
        seq.cpu_block_tables = []

    def hold(self, block_ids: set[int]) -> None:
        """Keep these blocks from being evicted until the step's copies are taken (the
        cached blocks that sequences of one plan will take)."""
        for block_id in block_ids:
            self._take(block_id)
            self.pinned.append(block_id)

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write pairs queued since the last call, for one batched copy (which
        runs before the step writes anything: the tails' sources held for it go back)."""
        copies, self.pending_copies = self.pending_copies, []
        for source in self.pinned:
            self._release(source)
        self.pinned = []
        self.unwritten.clear()
        return copies

    def can_swap_out(self, seqs: list[Sequence]) -> bool:
        return len(held_blocks(seq.block_tables for seq in seqs)) <= self.host.num_free

    def swap_out(self, seqs: list[Sequence]) -> list[tuple[int, int]]:
        """Move the blocks of ``seqs`` to the host pool, each shared block once."""
        mapping: dict[int, int] = {HOLE: HOLE}
        for seq in seqs:
            tables = []
            for table in seq.block_tables:
                for block_id in table:
                    if block_id not in mapping:
                        mapping[block_id] = self.host.allocate(self.blocks[block_id])
                    elif block_id != HOLE:
                        self.host.ref_counts[mapping[block_id]] += 1
                tables.append([mapping[block_id] for block_id in table])
            hashes, computed = seq.block_hashes, seq.num_computed_tokens
            self.free(seq)
            seq.cpu_block_tables, seq.block_hashes, seq.num_computed_tokens = (
                tables, hashes, computed)
        del mapping[HOLE]
        self.swapped_out += len(mapping)
        return list(mapping.items())

    def can_swap_in(self, seqs: list[Sequence], reserve: int = 0) -> bool:
        unique = held_blocks(seq.cpu_block_tables for seq in seqs)
        return len(unique) + reserve <= self.num_free_blocks

    def swap_in(self, seqs: list[Sequence]) -> list[tuple[int, int]]:
        """Bring the blocks of ``seqs`` back into the device pool, sharing preserved."""
        mapping: dict[int, int] = {HOLE: HOLE}
        for seq in seqs:
            tables = []
            for table in seq.cpu_block_tables:
                for host_id in table:
                    if host_id == HOLE:
                        continue
                    if host_id not in mapping:
                        mapping[host_id] = self._restore(self.host.saved[host_id])
                    else:
                        self.blocks[mapping[host_id]].ref_count += 1
                    self.host.release(host_id)
                tables.append([mapping[host_id] for host_id in table])
            seq.block_tables, seq.cpu_block_tables = tables, []
        del mapping[HOLE]
        self.swapped_in += len(mapping)
        return list(mapping.items())

    def _restore(self, saved: Block) -> int:
        block_id = self._pop_free(saved.group)
        key = (saved.group, saved.hash)
        if saved.hash != NO_HASH and key not in self.hash_to_block:
            self._publish(block_id, saved.group, saved.hash, saved.parent_hash, saved.token_ids)
        return block_id

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.evictable[block_id]
        block.ref_count += 1

    def _release(self, block_id: int) -> int:
        """Drop one reference; 1 if the block went back to the pool (free or cached)."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count:
            return 0
        if block.hash != NO_HASH:
            self.evictable[block_id] = None
        else:
            self.free_ids.append(block_id)
        return 1

    def _pop_free(self, group: int) -> int:
        if self.free_ids:
            block_id = self.free_ids.pop()
        else:
            block_id, _ = self.evictable.popitem(last=False)
            self._unpublish(self.blocks[block_id])
        self.blocks[block_id].ref_count = 1
        self.blocks[block_id].group = group
        self.high_water = max(self.high_water, block_id + 1)
        return block_id
