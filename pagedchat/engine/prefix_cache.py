"""The prefix cache, the half of ``BlockManager`` that finds and publishes full blocks by
their chained hash (``blocks.block_hash``); the pool it draws on is the other half's.

A lookup compares a block's stored tokens and parent hash too, so a hash collision never
makes a request read another's K/V. A prompt that ends inside a block another sequence
filled (a regenerated reply) finds that block among the children of its last full block and
starts from a copy of it (``PrefixHit.tail``): only its last token is computed, and not even
that one when the runner kept the prompt's last row (``kept_rows``) and the block holds the
last token too: the first new token is sampled from the kept row."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from pagedchat.engine.blocks import HOLE, NO_HASH, NO_HIT, Block, KeptRows, PrefixHit, block_hash
from pagedchat.engine.sequence import Sequence


class PrefixCache:
    """Mixed into ``BlockManager``, which owns these fields and the pool's moves
    (``window_start``, ``_pop_free``, ``_release``)."""

    block_size: int
    windows: tuple[int | None, ...]
    num_groups: int
    enable_prefix_caching: bool
    blocks: list[Block]
    free_ids: list[int]
    evictable: OrderedDict[int, None]
    hash_to_block: dict[tuple[int, int], int]  # (group, chain hash) -> block
    children: dict[tuple[int, int], set[int]]  # (group, parent hash) -> blocks
    # blocks published since the last copies were taken: their K/V may be written only by
    # the coming step, after its copies, so none is a tail's source yet
    unwritten: set[int]
    kept_rows: KeptRows  # prompts whose last row's hidden state the runner keeps

    def find_cached_prefix(self, seq: Sequence) -> PrefixHit:
        """Cached blocks holding the start of ``seq`` (read only, nothing taken): the longest
        run of full blocks every global group has cached, and every windowed group within the
        window of the first token left to compute, then the tail (see the module). The last
        token is left to compute, for its logits, unless the runner keeps its hidden state
        (``kept_rows``) and the blocks hold every token: then nothing is computed."""
        if not self.enable_prefix_caching or seq.block_tables:
            return NO_HIT
        slot = self.kept_rows.find(seq.token_ids)
        end = seq.num_tokens if slot is not None else seq.num_tokens - 1
        hashes, found = self._full_blocks(seq, end)
        if slot is not None:
            whole = self._hit(seq, hashes, found, end)
            if whole.num_tokens == seq.num_tokens:
                return replace(whole, kept_slot=slot)
            end -= 1
            count = end // self.block_size
            hashes, found = hashes[:count], [table[:count] for table in found]
        return self._hit(seq, hashes, found, end)

    def _full_blocks(self, seq: Sequence, end: int) -> tuple[list[int], list[list[int]]]:
        """The chain hashes of the full blocks within ``seq``'s first ``end`` tokens that
        every global group has cached, from the first on, and per group their blocks
        (``HOLE`` where a windowed group has none)."""
        bs = self.block_size
        hashes: list[int] = []
        found: list[list[int]] = [[] for _ in self.windows]
        parent = NO_HASH
        for start in range(0, end - bs + 1, bs):
            tokens = tuple(seq.token_ids[start : start + bs])
            h = block_hash(parent, tokens)
            row = [self._lookup(group, h, parent, tokens) for group in range(self.num_groups)]
            if any(block_id == HOLE and window is None
                   for block_id, window in zip(row, self.windows, strict=True)):
                break
            hashes.append(h)
            for table, block_id in zip(found, row, strict=True):
                table.append(block_id)
            parent = h
        return hashes, found

    def _hit(self, seq: Sequence, hashes: list[int], found: list[list[int]], end: int) -> PrefixHit:
        """The hit within ``seq``'s first ``end`` tokens from the full blocks found there:
        as many as every windowed group holds the window of, then the tail."""
        bs = self.block_size
        count = len(hashes)
        while count and not all(self._window_cached(group, found[group], count)
                                for group in range(self.num_groups)):
            count -= 1
        tail = ()
        if count == len(hashes):
            tail = self._find_tail(seq, count, hashes[-1] if count else NO_HASH, end)
        if not count and not tail:
            return NO_HIT
        computed = end if tail else count * bs
        tables = []
        for group, table in enumerate(found):
            start = min(self.window_start(group, computed), count)
            tables.append((HOLE,) * start + tuple(table[start:count]))
        return PrefixHit(tuple(tables), tuple(hashes[:count]), tail, computed)

    def _find_tail(self, seq: Sequence, count: int, parent: int, end: int) -> tuple[int, ...]:
        """Per group, a written cached child of the ``count`` blocks found whose tokens
        begin with the rest of ``seq``'s first ``end`` tokens; () where a group has none."""
        start = count * self.block_size
        rest = tuple(seq.token_ids[start:end])
        if not rest or len(rest) >= self.block_size:
            return ()
        tail = []
        for group in range(self.num_groups):
            block_id = next((child for child in self.children.get((group, parent), ())
                             if child not in self.unwritten
                             and self.blocks[child].token_ids[:len(rest)] == rest), HOLE)
            if block_id == HOLE:
                return ()
            tail.append(block_id)
        return tuple(tail)

    def _window_cached(self, group: int, found: list[int], count: int) -> bool:
        """Whether ``found`` holds every block of ``group`` that the first ``count`` blocks'
        successor reads."""
        start = self.window_start(group, count * self.block_size)
        return all(block_id != HOLE for block_id in found[start:count])

    def _lookup(self, group: int, h: int, parent: int, tokens: tuple[int, ...]) -> int:
        """The block of ``group`` cached under ``h`` with exactly these tokens and parent,
        else HOLE (a hash collision is never a hit)."""
        block_id = self.hash_to_block.get((group, h))
        if block_id is None:
            return HOLE
        block = self.blocks[block_id]
        return HOLE if block.token_ids != tokens or block.parent_hash != parent else block_id

    def cache_full_blocks(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Give every completed block of ``seq`` its hash so others can find it. ``num_tokens``
        (default: the computed ones) may include the current step's: every layer stores the
        step's K/V before any attention reads it, so a request admitted in it can share them."""
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
            for group, table in enumerate(seq.block_tables):
                block_id = table[index]
                if block_id == HOLE:
                    continue
                if self.blocks[block_id].hash == NO_HASH and (group, h) not in self.hash_to_block:
                    self._publish(block_id, group, h, parent, tokens)

    def _publish(self, block_id: int, group: int, h: int, parent: int,
                 tokens: tuple[int, ...]) -> None:
        """Make a full block findable by its chain hash and as a child of its parent."""
        block = self.blocks[block_id]
        block.hash, block.parent_hash, block.token_ids = h, parent, tokens
        self.hash_to_block[(group, h)] = block_id
        self.children.setdefault((group, parent), set()).add(block_id)
        self.unwritten.add(block_id)

    def _unpublish(self, block: Block) -> None:
        """An evicted block is found no more."""
        del self.hash_to_block[(block.group, block.hash)]
        siblings = self.children[(block.group, block.parent_hash)]
        siblings.discard(block.block_id)
        if not siblings:
            del self.children[(block.group, block.parent_hash)]
        block.hash, block.parent_hash, block.token_ids = NO_HASH, NO_HASH, ()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix: unreferenced cached blocks become free, blocks in
        use can no longer be found by later requests, and no kept row is read again."""
        self.kept_rows.clear()
        for block in self.blocks:
            block.hash, block.parent_hash, block.token_ids = NO_HASH, NO_HASH, ()
        self.free_ids.extend(reversed(self.evictable))
        self.evictable.clear()
        self.hash_to_block.clear()
        self.children.clear()

    # ---- the KV store's hooks (kv_store.py) ----------------------------------
    def cached_block(self, group: int, h: int, parent: int, tokens: tuple[int, ...]) -> int:
        """The block of ``group`` cached under ``h`` with these tokens (HOLE: none), made
        the most recently used, so that loading the blocks after it does not evict it."""
        block_id = self._lookup(group, h, parent, tokens)
        if block_id in self.evictable:
            self.evictable.move_to_end(block_id)
        return block_id

    def adopt(self, group: int, h: int, parent: int, tokens: tuple[int, ...]) -> int:
        """A free block, cached under ``h`` and unreferenced, whose K/V the caller writes
        before the next step; HOLE where another block holds ``h`` (a hash collision)."""
        if (group, h) in self.hash_to_block:
            return HOLE
        block_id = self._pop_free(group)
        self._publish(block_id, group, h, parent, tokens)
        self._release(block_id)
        return block_id
