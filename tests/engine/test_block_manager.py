"""Block manager invariants under random allocate / append / speculate / fork / free / swap /
evict runs. The machine also models what each block holds (copies, swaps and writes done as
the model runner does them): every table must hold its sequence's computed tokens, those
of a prompt found whole (its last row kept) included."""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedchat.engine.block_manager import BlockManager
from pagedchat.engine.blocks import HOLE, NO_HASH, NO_HIT, KeptRows, block_hash
from pagedchat.engine.sequence import Sequence

BLOCK_SIZE = 4
NUM_BLOCKS = 24


class BlockManagerMachine(RuleBasedStateMachine):
    """Drives a BlockManager as the scheduler and engine would, checking every invariant.
    ``WINDOWS``: the layer groups' sliding windows (one global group here)."""

    WINDOWS: tuple[int | None, ...] = (None,)

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE, num_host_blocks=16,
                               windows=self.WINDOWS)
        self.running: list[Sequence] = []
        self.swapped: list[list[Sequence]] = []
        # the token each slot of a device (host) block holds: the K/V written there
        self.content: dict[int, list[int | None]] = {}
        self.host_content: dict[int, list[int | None]] = {}

    # Prompts come from a tiny vocabulary so that prefixes repeat and hit the cache.
    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=14))
    def add_sequence(self, prompt):
        """A prompt computed and its last row kept, as the scheduler does: one found whole
        with a kept row computes nothing."""
        seq = Sequence(prompt, len(prompt))
        cached = self.bm.find_cached_prefix(seq)
        assert (cached.kept_slot is not None) == (cached.num_tokens == len(prompt))
        if self.bm.allocate_slots(seq, len(prompt) - cached.num_tokens, cached):
            self._written_blocks_are_private(seq, cached.num_tokens)
            self._compute(seq)
            self.bm.kept_rows.keep([tuple(prompt)])
            self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=6))
    def append(self, data, tokens):
        seq = data.draw(st.sampled_from(self.running))
        before = seq.num_computed_tokens
        seq.token_ids.extend(tokens)
        if self.bm.allocate_slots(seq, len(tokens)):
            self._written_blocks_are_private(seq, before)
            self._compute(seq)
        else:
            del seq.token_ids[-len(tokens):]

    @precondition(lambda self: self.running)
    @rule(data=st.data(), token=st.integers(0, 2),
          draft=st.lists(st.integers(0, 2), min_size=1, max_size=6), accepted=st.integers(0, 6))
    def speculate(self, data, token, draft, accepted):
        """A speculative step: slots for one token and a draft, then the rejected part of
        the draft rolled back; what it wrote into is private, what it gives back is free."""
        seq = data.draw(st.sampled_from(self.running))
        before = seq.num_computed_tokens
        seq.token_ids.append(token)
        if not self.bm.allocate_slots(seq, 1 + len(draft)):
            seq.token_ids.pop()
            return
        for table in seq.block_tables:
            for block_id in table[before // BLOCK_SIZE : (before + len(draft)) // BLOCK_SIZE + 1]:
                assert block_id != HOLE and self.bm.blocks[block_id].ref_count == 1
        self._copy(self.bm.take_copies())
        kept = min(accepted, len(draft))
        seq.token_ids.extend(draft[:kept])
        self._write(seq, before, before + 1 + kept)
        seq.num_computed_tokens = before + 1 + kept
        free, cached = len(self.bm.free_ids), set(self.bm.evictable)
        returned = self.bm.truncate(seq)
        assert len(self.bm.free_ids) == free + returned and set(self.bm.evictable) == cached
        assert returned <= len(seq.block_tables) * (self.bm.blocks_for(
            before + 1 + len(draft)) - self.bm.blocks_for(seq.num_computed_tokens))
        for table in seq.block_tables:
            assert len(table) == self.bm.blocks_for(seq.num_computed_tokens)
        self.bm.cache_full_blocks(seq)
        self.bm.take_copies()

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.running))
        child = parent.fork(1)
        self.bm.fork(parent, child)
        self.running.append(child)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.running))
        self.running.remove(seq)
        self.bm.free(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), size=st.integers(1, 3))
    def swap_out_group(self, data, size):
        group = data.draw(st.lists(st.sampled_from(self.running), min_size=1, max_size=size,
                                   unique=True))
        if not self.bm.can_swap_out(group):
            return
        computed = [seq.num_computed_tokens for seq in group]
        mapping = self._swap_out(group)
        assert len(mapping) == len(_held(group, "cpu_block_tables"))
        assert [seq.num_computed_tokens for seq in group] == computed
        for seq in group:
            self.running.remove(seq)
            assert seq.block_tables == []
        self.swapped.append(group)

    @precondition(lambda self: self.swapped)
    @rule()
    def swap_in_group(self):
        group = self.swapped[0]
        if not self.bm.can_swap_in(group):
            return
        shared_before = _sharing_shape(group, "cpu_block_tables")
        for host_id, block_id in self.bm.swap_in(group):
            self.content[block_id] = list(self.host_content[host_id])
        assert _sharing_shape(group, "block_tables") == shared_before
        self.swapped.pop(0)
        self.running.extend(group)

    def _compute(self, seq: Sequence) -> None:
        """The step: copies first, then the uncomputed tokens' K/V written."""
        self._copy(self.bm.take_copies())
        self._write(seq, seq.num_computed_tokens, seq.num_tokens)
        seq.num_computed_tokens = seq.num_tokens
        self.bm.cache_full_blocks(seq)

    def _swap_out(self, group: list[Sequence]) -> list[tuple[int, int]]:
        mapping = self.bm.swap_out(group)
        for block_id, host_id in mapping:
            self.host_content[host_id] = list(self.content.get(block_id, []))
        return mapping

    def _copy(self, pairs: list[tuple[int, int]]) -> None:
        contents = [list(self.content.get(src, [])) for src, _ in pairs]  # one batched copy
        for (_, dst), content in zip(pairs, contents, strict=True):
            self.content[dst] = content

    def _write(self, seq: Sequence, start: int, end: int) -> None:
        for position in range(start, end):
            for table in seq.block_tables:
                block_id = table[position // BLOCK_SIZE]
                if block_id != HOLE:
                    slots = self.content.setdefault(block_id, [None] * BLOCK_SIZE)
                    slots[position % BLOCK_SIZE] = seq.token_ids[position]

    def _written_blocks_are_private(self, seq: Sequence, start: int) -> None:
        """Copy-on-write: no block that receives new tokens is read by another table."""
        first, last = start // BLOCK_SIZE, (seq.num_tokens - 1) // BLOCK_SIZE
        for table in seq.block_tables:
            for block_id in table[first : last + 1]:
                assert block_id != HOLE and self.bm.blocks[block_id].ref_count == 1

    @invariant()
    def each_block_in_exactly_one_state(self):
        bm = self.bm
        free, evictable = set(bm.free_ids), set(bm.evictable)
        assert len(free) == len(bm.free_ids)
        for block in bm.blocks:
            states = [block.ref_count > 0, block.block_id in evictable, block.block_id in free]
            assert sum(states) == 1, f"block {block.block_id} is in {states}"
            if block.block_id in evictable:
                assert block.hash != NO_HASH
            if block.block_id in free:
                assert block.hash == NO_HASH

    @invariant()
    def ref_counts_equal_table_references(self):
        refs = Counter(b for seq in self.running for t in seq.block_tables for b in t if b != HOLE)
        for block in self.bm.blocks:
            assert block.ref_count == refs.get(block.block_id, 0)
        host_refs = Counter(b for group in self.swapped for s in group for t in s.cpu_block_tables
                            for b in t if b != HOLE)
        for block_id, count in enumerate(self.bm.host.ref_counts):
            assert count == host_refs.get(block_id, 0)

    @invariant()
    def tables_hold_their_tokens(self):
        for seq in self.running:
            for table in seq.block_tables:
                for position in range(seq.num_computed_tokens):
                    block_id = table[position // BLOCK_SIZE]
                    if block_id != HOLE:
                        held = self.content.get(block_id, [None] * BLOCK_SIZE)
                        assert held[position % BLOCK_SIZE] == seq.token_ids[position], \
                            f"block {block_id} slot {position % BLOCK_SIZE}"

    @invariant()
    def hashes_match_contents(self):
        for (group, h), block_id in self.bm.hash_to_block.items():
            block = self.bm.blocks[block_id]
            assert block.group == group
            assert block.hash == h == block_hash(block.parent_hash, block.token_ids)
            assert len(block.token_ids) == BLOCK_SIZE

    def teardown(self):
        for group in self.swapped:
            for seq in group:
                self.bm.free(seq)
        for seq in self.running:
            self.bm.free(seq)
        assert all(block.ref_count == 0 for block in self.bm.blocks)
        assert len(self.bm.free_ids) + len(self.bm.evictable) == NUM_BLOCKS
        assert self.bm.host.num_free == self.bm.host.num_blocks


def _sharing_shape(group: list[Sequence], attr: str) -> list[list[list[int]]]:
    """Block tables (``attr``: every group's) renamed by first appearance, holes kept:
    equal shapes mean equal sharing."""
    names: dict[int, int] = {HOLE: HOLE}
    return [[[names.setdefault(b, len(names)) for b in table] for table in getattr(s, attr)]
            for s in group]


def _held(group: list[Sequence], attr: str) -> set[int]:
    return {b for s in group for table in getattr(s, attr) for b in table if b != HOLE}


# Fewer runs than the machines that extend this one: test_sharing_properties' (on the same
# one-group pool) and test_window_blocks' (three groups) run every rule and invariant here
# too, beside their own.
TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)


def test_prefix_blocks_found_again_with_exact_ids_and_ref_counts():
    bm = BlockManager(10, 4)
    first = Sequence(list(range(10)), 10)
    assert bm.allocate_slots(first, 10)
    first.num_computed_tokens = 10
    bm.cache_full_blocks(first)
    assert first.block_table == [0, 1, 2]
    assert [bm.blocks[b].hash != NO_HASH for b in first.block_table] == [True, True, False]
    second = Sequence(list(range(8)) + [99, 98], 10)
    cached = bm.find_cached_prefix(second)
    assert cached.tables == ((0, 1),) and cached.num_blocks == 2
    assert bm.allocate_slots(second, 2, cached)
    assert second.block_table[:2] == [0, 1] and second.num_computed_tokens == 8
    assert [bm.blocks[b].ref_count for b in (0, 1, 2)] == [2, 2, 1]


def test_prefix_hit_never_covers_the_last_token():
    bm = BlockManager(10, 4)
    seq = Sequence(list(range(8)), 8)
    bm.allocate_slots(seq, 8)
    seq.num_computed_tokens = 8
    bm.cache_full_blocks(seq)
    again = Sequence(list(range(8)), 8)
    assert bm.find_cached_prefix(again).tables == ((0,),)


def _after_a_reply(prompt_len: int) -> BlockManager:
    """A manager of 10 blocks of 4 after a sequence of tokens 0..9 (its prompt the first
    ``prompt_len``, then a reply) was computed, cached and freed."""
    bm = BlockManager(10, 4)
    first = Sequence(list(range(10)), prompt_len)
    assert bm.allocate_slots(first, 10)
    first.num_computed_tokens = 10
    bm.cache_full_blocks(first)
    bm.take_copies()
    bm.free(first)
    return bm


def test_a_kept_prompt_found_whole_computes_nothing():
    """With its last row kept, a prompt whose every token is in cached blocks (the tail's
    copy holding its last token) is a hit of the whole prompt; without, the last token is
    left to compute."""
    bm = _after_a_reply(7)
    again = Sequence(list(range(7)), 7)
    assert bm.find_cached_prefix(again).num_tokens == 6
    [slot] = bm.kept_rows.keep([tuple(range(7))])
    hit = bm.find_cached_prefix(again)
    assert (hit.tables, hit.tail, hit.num_tokens, hit.kept_slot) == (((0,),), (1,), 7, slot)
    assert bm.allocate_slots(again, 0, hit)
    fresh = again.block_table[1]
    assert again.num_computed_tokens == 7 and bm.take_copies() == [(1, fresh)]
    # a prompt of whole blocks needs no tail; one differing in its last token is no hit
    bm.kept_rows.keep([tuple(range(8))])
    whole = bm.find_cached_prefix(Sequence(list(range(8)), 8))
    assert (whole.tables, whole.tail, whole.num_tokens) == (((0, 1),), (), 8)
    other = bm.find_cached_prefix(Sequence([*range(7), 9], 8))
    assert other.kept_slot is None and other.num_tokens == 7
    # the kept rows go with the prefix cache
    bm.free(again)
    bm.reset_prefix_cache()
    assert not bm.kept_rows.slots
    assert bm.find_cached_prefix(Sequence(list(range(7)), 7)) == NO_HIT


def test_kept_rows_are_bounded_least_recently_used_first_and_exact():
    rows = KeptRows(3)
    a, b, c, d = (1, 2), (1, 3), (2, 2), (4,)
    assert rows.keep([a, b, c]) == [0, 1, 2]
    assert rows.keep([a]) == [None]  # kept already: now the most recently used
    assert rows.keep([d]) == [1] and rows.find(list(b)) is None
    rows.use(rows.find(list(c)))
    assert rows.keep([(5,)]) == [0]  # a went before c, read since
    assert rows.find([1]) is None and rows.find([2, 2, 0]) is None
    # one step never gets a slot twice, even for more prompts than slots
    given = rows.keep([(6,), (7,), (8,), (9,), (6,)])
    assert given == [1, 2, 0, None, None]
    assert len(rows.slots) == 3
    rows.clear()
    assert rows.keep([a]) == [0]
    # a prompt kept already and made the most recently used does not free a slot given
    rows = KeptRows(2)
    rows.keep([a, b])
    assert rows.keep([c, b, d]) == [0, None, 1]
    assert dict(rows.slots) == {c: 0, d: 1}


def test_a_prompt_ending_inside_a_cached_block_starts_from_a_copy_of_it():
    bm = _after_a_reply(10)
    again = Sequence(list(range(7)), 7)
    hit = bm.find_cached_prefix(again)
    assert hit.tables == ((0,),) and hit.tail == (1,) and hit.num_tokens == 6
    assert bm.allocate_slots(again, 1, hit)
    fresh = again.block_table[1]
    assert again.num_computed_tokens == 6 and fresh not in (0, 1)
    assert bm.ref_count(1) == 1  # held for the copy
    assert bm.take_copies() == [(1, fresh)]
    assert bm.block_state(1) == "cached"
    # a block hashed in this schedule is written only by the coming step: no source yet
    third = Sequence(list(range(20, 30)), 10)
    assert bm.allocate_slots(third, 10)
    bm.cache_full_blocks(third, 10)
    assert bm.find_cached_prefix(Sequence(list(range(20, 27)), 7)).tail == ()


def test_eviction_is_lru_and_tail_first():
    bm = BlockManager(6, 2)
    older, newer = Sequence([1, 2, 3, 4], 4), Sequence([5, 6, 7, 8], 4)
    for seq in (older, newer):
        bm.allocate_slots(seq, 4)
        seq.num_computed_tokens = 4
        bm.cache_full_blocks(seq)
    bm.free(older)
    bm.free(newer)
    # older's tail, older's head, then newer's tail, newer's head
    assert list(bm.evictable) == [1, 0, 3, 2]
    taker = Sequence(list(range(20, 32)), 12)
    assert bm.allocate_slots(taker, 12)
    # never-cached free blocks first, then cached ones in LRU order
    assert taker.block_table == [4, 5, 1, 0, 3, 2]
    assert not bm.hash_to_block


def test_collision_with_different_tokens_is_not_a_hit():
    bm = BlockManager(4, 2)
    seq = Sequence([1, 2, 3], 3)
    bm.allocate_slots(seq, 3)
    seq.num_computed_tokens = 3
    bm.cache_full_blocks(seq)
    h = seq.block_hashes[0]
    bm.blocks[bm.hash_to_block[(0, h)]].token_ids = (7, 7)  # forge a colliding entry
    assert bm.find_cached_prefix(Sequence([1, 2, 3], 3)) == NO_HIT


def test_reset_prefix_cache_forgets_every_prefix():
    bm = BlockManager(6, 2)
    seq = Sequence([1, 2, 3, 4, 5], 5)
    bm.allocate_slots(seq, 5)
    seq.num_computed_tokens = 5
    bm.cache_full_blocks(seq)
    other = Sequence([7, 8, 9], 3)
    bm.allocate_slots(other, 3)
    other.num_computed_tokens = 3
    bm.cache_full_blocks(other)
    bm.free(other)
    assert len(bm.evictable) == 1
    bm.reset_prefix_cache()
    assert not bm.evictable and not bm.hash_to_block
    assert bm.find_cached_prefix(Sequence([1, 2, 3, 4, 5, 6], 6)) == NO_HIT
    assert bm.num_free_blocks == 3 and len(bm.free_ids) == 3
