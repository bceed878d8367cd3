"""The KV block pool: free list, reference counts, copy-on-write, prefix cache, swap pool.

Every physical block is in exactly one of three states:
- referenced: ``ref_count > 0``, in one or more block tables;
- cached-evictable: ``ref_count == 0`` but it holds a full block found again by its
  hash; kept in LRU order and reused only when no free block is left;
- free: ``ref_count == 0`` and no hash.

Full blocks are hashed over the whole prefix (the parent block's hash, then the
block's tokens). A lookup compares the stored tokens and parent hash too, so a hash
collision can never make a request read another request's K/V.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import xxhash

from pagedchat.engine.sequence import Sequence

NO_HASH = -1


def block_hash(parent_hash: int, token_ids: list[int] | tuple[int, ...]) -> int:
    """The chained hash of one full block: its tokens and everything before them."""
    digest = xxhash.xxh3_64()
    digest.update(parent_hash.to_bytes(8, "little", signed=True))
    digest.update(b"".join(t.to_bytes(4, "little") for t in token_ids))
    return digest.intdigest() & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int = NO_HASH
    parent_hash: int = NO_HASH
    token_ids: tuple[int, ...] = ()


class HostPool:
    """The host-memory swap pool: its own free list and reference counts."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free_ids = list(range(num_blocks - 1, -1, -1))
        self.ref_counts = [0] * num_blocks
        self.saved: dict[int, Block] = {}

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def allocate(self, source: Block) -> int:
        block_id = self.free_ids.pop()
        self.ref_counts[block_id] = 1
        self.saved[block_id] = Block(block_id, 0, source.hash, source.parent_hash, source.token_ids)
        return block_id

    def release(self, block_id: int) -> None:
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            del self.saved[block_id]
            self.free_ids.append(block_id)


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_host_blocks: int = 0,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids = list(range(num_blocks - 1, -1, -1))
        # Free ids are handed out lowest first and reused last-freed first, so blocks at or
        # above this mark were never used: how much of the pool a run needed.
        self.high_water = 0
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.hash_to_block: dict[int, int] = {}
        self.host = HostPool(num_host_blocks)
        self.pending_copies: list[tuple[int, int]] = []
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.swapped_out = 0
        self.swapped_in = 0

    # ---- capacity -------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: free plus cached-evictable."""
        return len(self.free_ids) + len(self.evictable)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache ---------------------------------------------------------
    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding the start of ``seq`` (read only, nothing taken).

        The last token is always left to compute, so its logits exist."""
        if not self.enable_prefix_caching or seq.block_table:
            return []
        found: list[int] = []
        parent = NO_HASH
        bs = self.block_size
        for start in range(0, seq.num_tokens - 1 - bs + 1, bs):
            tokens = tuple(seq.token_ids[start : start + bs])
            h = block_hash(parent, tokens)
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != tokens or block.parent_hash != parent:
                break
            found.append(block_id)
            parent = h
        return found

    def cache_full_blocks(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Give every completed block of ``seq`` its hash so others can find it.

        ``num_tokens`` (default: the computed ones) may include tokens scheduled in the
        current step: every layer stores the whole step's K/V before any attention
        reads it, so a request admitted in the same step can already share them."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = (seq.num_computed_tokens if num_tokens is None else num_tokens) // bs
        while len(seq.block_hashes) < num_full:
            index = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else NO_HASH
            tokens = tuple(seq.token_ids[index * bs : (index + 1) * bs])
            h = block_hash(parent, tokens)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[index]]
            if block.hash == NO_HASH and h not in self.hash_to_block:
                block.hash, block.parent_hash, block.token_ids = h, parent, tokens
                self.hash_to_block[h] = block.block_id

    # ---- allocation -----------------------------------------------------------
    def blocks_needed(
        self, seq: Sequence, num_new_tokens: int, num_cached_blocks: int = 0,
        refs: dict[int, int] | None = None,
    ) -> int:
        """Fresh blocks ``allocate_slots`` would pop for ``seq`` (cached hits not counted).

        ``refs`` (block id -> ref count) lets a caller count several sequences that
        share blocks as if they were allocated one after another."""
        refs = refs if refs is not None else {}
        computed = seq.num_computed_tokens + num_cached_blocks * self.block_size
        have = len(seq.block_table) + num_cached_blocks
        need = max(self.blocks_for(computed + num_new_tokens) - have, 0)
        if num_new_tokens and computed % self.block_size and seq.block_table:
            last = seq.block_table[-1]
            count = refs.get(last, self.blocks[last].ref_count)
            if count > 1:
                need += 1
                refs[last] = count - 1
        return need

    def evictable_taken(self, cached: set[int] | list[int]) -> int:
        """How many of these cached blocks would leave the evictable list when taken."""
        return sum(1 for block_id in set(cached) if self.blocks[block_id].ref_count == 0)

    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, cached: list[int] | tuple[int, ...] = ()
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens of ``seq``; False if blocks ran out.

        Takes the ``cached`` prefix blocks first (their tokens count as computed),
        copies a shared, partly filled last block before it is written (copy-on-write),
        then appends fresh blocks. Nothing changes when it returns False."""
        need = self.blocks_needed(seq, num_new_tokens, len(cached)) + self.evictable_taken(cached)
        if need > self.num_free_blocks:
            return False
        if cached:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += len(cached) * self.block_size
            for block_id in cached:
                self._take(block_id)
                seq.block_table.append(block_id)
                seq.block_hashes.append(self.blocks[block_id].hash)
            seq.num_computed_tokens = len(cached) * self.block_size
        elif not seq.block_table and self.enable_prefix_caching:
            self.prefix_queries += seq.num_tokens
        computed = seq.num_computed_tokens
        if num_new_tokens and computed % self.block_size:
            last = seq.block_table[-1]
            if self.blocks[last].ref_count > 1:
                fresh = self._pop_free()
                self.blocks[last].ref_count -= 1
                self.pending_copies.append((last, fresh))
                seq.block_table[-1] = fresh
        while len(seq.block_table) < self.blocks_for(computed + num_new_tokens):
            seq.block_table.append(self._pop_free())
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` shares every block of ``parent`` (ref counts go up, nothing is copied)."""
        child.block_table = list(parent.block_table)
        for block_id in child.block_table:
            self.blocks[block_id].ref_count += 1

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references, tail first, so its tail is evicted before its head."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash != NO_HASH:
                    self.evictable[block_id] = None
                else:
                    self.free_ids.append(block_id)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0
        for block_id in seq.cpu_block_table:
            self.host.release(block_id)
        seq.cpu_block_table = []

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix: unreferenced cached blocks become free, and blocks
        in use can no longer be found by later requests."""
        for block in self.blocks:
            block.hash, block.parent_hash, block.token_ids = NO_HASH, NO_HASH, ()
        self.free_ids.extend(reversed(self.evictable))
        self.evictable.clear()
        self.hash_to_block.clear()

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write pairs queued since the last call, for one batched copy."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    # ---- swapping -------------------------------------------------------------
    def can_swap_out(self, seqs: list[Sequence]) -> bool:
        unique = {b for seq in seqs for b in seq.block_table}
        return len(unique) <= self.host.num_free

    def swap_out(self, seqs: list[Sequence]) -> list[tuple[int, int]]:
        """Move the blocks of ``seqs`` to the host pool, each shared block once."""
        mapping: dict[int, int] = {}
        for seq in seqs:
            table = []
            for block_id in seq.block_table:
                if block_id not in mapping:
                    mapping[block_id] = self.host.allocate(self.blocks[block_id])
                else:
                    self.host.ref_counts[mapping[block_id]] += 1
                table.append(mapping[block_id])
            hashes, computed = seq.block_hashes, seq.num_computed_tokens
            self.free(seq)
            seq.cpu_block_table, seq.block_hashes, seq.num_computed_tokens = table, hashes, computed
        self.swapped_out += len(mapping)
        return list(mapping.items())

    def can_swap_in(self, seqs: list[Sequence], reserve: int = 0) -> bool:
        unique = {b for seq in seqs for b in seq.cpu_block_table}
        return len(unique) + reserve <= self.num_free_blocks

    def swap_in(self, seqs: list[Sequence]) -> list[tuple[int, int]]:
        """Bring the blocks of ``seqs`` back into the device pool, sharing preserved."""
        mapping: dict[int, int] = {}
        for seq in seqs:
            table = []
            for host_id in seq.cpu_block_table:
                if host_id not in mapping:
                    mapping[host_id] = self._restore(self.host.saved[host_id])
                else:
                    self.blocks[mapping[host_id]].ref_count += 1
                table.append(mapping[host_id])
                self.host.release(host_id)
            seq.block_table, seq.cpu_block_table = table, []
        self.swapped_in += len(mapping)
        return list(mapping.items())

    # ---- internals ------------------------------------------------------------
    def _restore(self, saved: Block) -> int:
        block_id = self._pop_free()
        if saved.hash != NO_HASH and saved.hash not in self.hash_to_block:
            block = self.blocks[block_id]
            block.hash, block.parent_hash, block.token_ids = (
                saved.hash, saved.parent_hash, saved.token_ids)
            self.hash_to_block[saved.hash] = block_id
        return block_id

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.evictable[block_id]
        block.ref_count += 1

    def _pop_free(self) -> int:
        if self.free_ids:
            block_id = self.free_ids.pop()
        else:
            block_id, _ = self.evictable.popitem(last=False)
            block = self.blocks[block_id]
            del self.hash_to_block[block.hash]
            block.hash, block.parent_hash, block.token_ids = NO_HASH, NO_HASH, ()
        self.blocks[block_id].ref_count = 1
        self.high_water = max(self.high_water, block_id + 1)
        return block_id
