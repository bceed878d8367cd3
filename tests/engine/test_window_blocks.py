"""Two kinds of layer groups in one pool: a global group and windowed (local) groups whose
blocks go back to the pool as they slide out of the window.

The stateful machine extends test_sharing_properties' (forks, beams, swaps, prefix hits,
every invariant of the one-group pool) with windowed groups, chunked computation and
slides. The scheduler test drives the real Scheduler through whole runs (chunked prefill,
n > 1, prefix hits, preemption by recompute and by swap) against a simulated KV cache,
and checks that every slot a step reads holds what that sequence wrote there.
"""

from __future__ import annotations

import random

import hypothesis.strategies as st
from hypothesis import given, settings
from hypothesis.stateful import invariant, precondition, rule

from pagedchat.engine.block_manager import BlockManager
from pagedchat.engine.blocks import HOLE, NO_HIT, KeptRows
from pagedchat.engine.config import EngineConfig
from pagedchat.engine.errors import RequestError
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.engine.scheduler import Scheduler
from pagedchat.engine.sequence import Sequence, SequenceGroup
from tests.engine.test_block_manager import BLOCK_SIZE
from tests.engine.test_sharing_properties import GroupMachine

WINDOW = 6


def holes(table: list[int]) -> int:
    """Leading holes of a table (holes are only ever a prefix)."""
    count = 0
    while count < len(table) and table[count] == HOLE:
        count += 1
    assert HOLE not in table[count:]
    return count


class WindowMachine(GroupMachine):
    WINDOWS = (None, WINDOW, WINDOW)  # one global group, two local ones

    @precondition(lambda self: self.running)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=20),
          chunk=st.integers(1, 7))
    def compute_in_chunks(self, data, tokens, chunk):
        """A prompt-like run of tokens computed a chunk a step, sliding between steps;
        stops (the rest dropped) when blocks run out."""
        seq = data.draw(st.sampled_from(self.running))
        seq.token_ids.extend(tokens)
        while seq.num_computed_tokens < seq.num_tokens:
            self._slide(seq)
            start = seq.num_computed_tokens
            take = min(chunk, seq.num_tokens - start)
            if not self.bm.allocate_slots(seq, take):
                del seq.token_ids[start:]
                return
            self._written_blocks_are_private_range(seq, start, start + take)
            self._window_is_present(seq, start, start + take)
            self._copy(self.bm.take_copies())
            self._write(seq, start, start + take)
            seq.num_computed_tokens += take
            self.bm.cache_full_blocks(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def slide(self, data):
        self._slide(data.draw(st.sampled_from(self.running)))

    def _slide(self, seq: Sequence) -> None:
        """The blocks slid out go back, their count as the formula says; a block shared
        with another table only loses a reference."""
        bm = self.bm
        releasing = [table[holes(table):bm.window_start(g, seq.num_computed_tokens)]
                     for g, table in enumerate(seq.block_tables)]
        expected = sum(1 for part in releasing for b in part if bm.blocks[b].ref_count == 1)
        freed_before = bm.window_freed
        assert bm.slide(seq) == expected
        assert bm.window_freed == freed_before + expected
        for g, table in enumerate(seq.block_tables):
            assert holes(table) == bm.window_start(g, seq.num_computed_tokens)

    def _written_blocks_are_private_range(self, seq: Sequence, start: int, end: int) -> None:
        for table in seq.block_tables:
            for block_id in table[start // BLOCK_SIZE : (end - 1) // BLOCK_SIZE + 1]:
                assert block_id != HOLE and self.bm.blocks[block_id].ref_count == 1

    def _window_is_present(self, seq: Sequence, start: int, end: int) -> None:
        """Every block the step's queries (positions start..end-1) read is in the table."""
        for g, table in enumerate(seq.block_tables):
            window = self.bm.windows[g]
            first = 0 if window is None else max(start - window + 1, 0)
            for position in range(first, end):
                assert table[position // BLOCK_SIZE] != HOLE

    @invariant()
    def tables_are_positional_and_hold_their_window(self):
        for seq in self.running:
            lengths = {len(table) for table in seq.block_tables}
            assert lengths == {self.bm.blocks_for(seq.num_computed_tokens)}
            for g, table in enumerate(seq.block_tables):
                assert holes(table) <= self.bm.window_start(g, seq.num_computed_tokens)
                if self.bm.windows[g] is None:
                    assert HOLE not in table


TestWindowBlocks = WindowMachine.TestCase
TestWindowBlocks.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)


def _computed(bm: BlockManager, tokens: list[int], chunk: int) -> Sequence:
    seq = Sequence(tokens, len(tokens))
    while seq.num_computed_tokens < seq.num_tokens:
        bm.slide(seq)
        take = min(chunk, seq.num_tokens - seq.num_computed_tokens)
        assert bm.allocate_slots(seq, take)
        seq.num_computed_tokens += take
        bm.cache_full_blocks(seq)
    return seq


def test_a_long_sequence_holds_its_window_not_its_length():
    bm = BlockManager(64, 4, windows=(None, 8))
    seq = _computed(bm, list(range(100)), 5)
    bm.slide(seq)
    assert len(seq.block_tables[0]) == 25 and HOLE not in seq.block_tables[0]
    # the next query (position 100) reads 93..100: blocks 23..25 from the local group
    assert holes(seq.block_tables[1]) == 23
    assert sum(b.ref_count for b in bm.blocks) == 25 + 2
    bm.free(seq)
    assert bm.num_free_blocks == 64


def test_prefix_hit_takes_only_the_window_of_a_local_group():
    bm = BlockManager(64, 4, windows=(None, 8))
    first = _computed(bm, list(range(40)), 40)
    bm.slide(first)
    again = Sequence(list(range(40)) + [7], 41)
    hit = bm.find_cached_prefix(again)
    # 10 full blocks cached globally; the next query (position 40) reads 33..40
    assert hit.num_blocks == 10
    assert hit.tables[0] == tuple(first.block_tables[0])
    assert hit.tables[1][:8] == (HOLE,) * 8 and HOLE not in hit.tables[1][8:]
    assert bm.allocate_slots(again, 1, hit)
    assert again.num_computed_tokens == 40


def test_prefix_hit_shrinks_until_its_window_blocks_are_cached():
    bm = BlockManager(64, 4, windows=(None, 8), enable_prefix_caching=True)
    first = _computed(bm, list(range(40)), 40)
    bm.slide(first)
    # forget the local group's last two blocks: a hit must stop where its window is whole
    for block_id in first.block_tables[1][8:]:
        block = bm.blocks[block_id]
        del bm.hash_to_block[(1, block.hash)]
    hit = bm.find_cached_prefix(Sequence(list(range(40)) + [7], 41))
    # a hit of 9 or 10 blocks would read block 8 in the window; at 8 blocks the window
    # (positions 25..32) reads blocks 6 and 7, slid out of the first sequence but cached
    assert hit.num_blocks == 8
    assert all(block_id != HOLE for block_id in hit.tables[1][6:8])


def test_no_prefix_hit_without_the_global_chain():
    bm = BlockManager(16, 4, windows=(None, 8))
    assert bm.find_cached_prefix(Sequence(list(range(12)), 12)) == NO_HIT


def test_max_blocks_counts_the_window_and_one_chunk():
    bm = BlockManager(64, 16, windows=(None, 512, 512))
    assert bm.max_blocks(100, 64) == 3 * 7
    assert bm.max_blocks(16384, 1024) == 1024 + 2 * (bm.blocks_for(511 + 1024) + 1)


# ---- whole runs through the scheduler against a simulated cache ------------------------


class SimulatedCache:
    """What each physical slot holds: ``(group, prefix)`` of the token written there,
    where ``prefix`` is the whole history up to it (its K/V depends on nothing else); and
    the history whose last row each kept slot holds."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.device: dict[int, list] = {}
        self.host: dict[int, list] = {}
        self.kept: dict[int, tuple[int, ...]] = {}

    def run(self, out, windows) -> None:
        bs = self.block_size
        for src, dst in out.swap_out:
            self.host[dst] = list(self.device.get(src, [None] * bs))
        for src, dst in out.swap_in:
            self.device[dst] = list(self.host[src])
        for src, dst in out.copies:
            self.device[dst] = list(self.device.get(src, [None] * bs))
        step = out.step_input(bs)
        sampled = [item for item in out.scheduled if item.samples and not item.draft]
        for i, slot in step.from_kept:  # read before this step's keeps are written
            assert self.kept[slot] == tuple(sampled[i].seq.token_ids), "another row's state"
        for i, slot in step.keep:
            self.kept[slot] = tuple(sampled[i].seq.token_ids)
        computing = [item for item in out.scheduled if item.num_new_tokens]
        for g in range(len(windows)):
            row = 0
            for item in out.scheduled:
                seq = item.seq
                for p in range(seq.num_computed_tokens,
                               seq.num_computed_tokens + item.num_new_tokens):
                    slot = int(step.slot_mapping[g, row])
                    self.device.setdefault(slot // bs, [None] * bs)[slot % bs] = (
                        g, tuple(seq.token_ids[: p + 1]))
                    row += 1
        for g, window in enumerate(windows):
            for i, item in enumerate(computing):
                seq = item.seq
                for q in range(seq.num_computed_tokens,
                               seq.num_computed_tokens + item.num_new_tokens):
                    first = 0 if window is None else max(q - window + 1, 0)
                    for p in range(first, q + 1):
                        block = int(step.block_tables[g, i, p // bs])
                        assert block != HOLE, f"group {g} reads position {p} from a hole"
                        held = self.device[block][p % bs]
                        assert held == (g, tuple(seq.token_ids[: p + 1])), (
                            f"group {g}, position {p}: the slot holds another token's K/V")


@settings(max_examples=40, deadline=None)
@given(data=st.data(), mode=st.sampled_from(["recompute", "swap"]),
       caching=st.booleans(), num_blocks=st.integers(30, 60),
       budget=st.integers(3, 24), kept_rows=st.integers(1, 3))
def test_scheduler_runs_read_only_what_they_wrote(data, mode, caching, num_blocks, budget,
                                                  kept_rows):
    """Each request that finishes may come back once with the same prompt (a regenerate),
    which may then compute nothing, sampling from a kept row."""
    windows = (None, WINDOW, WINDOW)
    bm = BlockManager(num_blocks, BLOCK_SIZE, num_host_blocks=200,
                      enable_prefix_caching=caching, windows=windows)
    bm.kept_rows = KeptRows(kept_rows)
    config = EngineConfig(block_size=BLOCK_SIZE, num_kv_blocks=num_blocks, max_num_seqs=6,
                          max_num_batched_tokens=budget, preemption_mode=mode,
                          max_model_len=200)
    scheduler = Scheduler(config, bm)
    shared = data.draw(st.lists(st.integers(0, 3), min_size=0, max_size=14))
    rng = random.Random(data.draw(st.integers(0, 1000)))
    for index in range(data.draw(st.integers(1, 5))):
        prompt = shared + data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=20))
        n = data.draw(st.integers(1, 3))
        params = SamplingParams(n=n, temperature=1.0, max_tokens=data.draw(st.integers(1, 12)))
        try:
            scheduler.fit.check(len(prompt), params)
        except RequestError:
            continue
        scheduler.add(SequenceGroup(f"r{index}", None, prompt, params))
    cache = SimulatedCache(BLOCK_SIZE)
    for _ in range(2000):
        if not scheduler.has_unfinished():
            break
        out = scheduler.schedule()
        cache.run(out, windows)
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
        for item in out.scheduled:
            if not item.samples:
                continue
            group = item.group
            seqs = [item.seq]
            if not group.forked:
                seqs += [scheduler.fork(item.seq, i) for i in range(1, group.params.best_of)]
                group.seqs, group.forked = seqs, True
            for seq in seqs:
                seq.append_token(rng.randrange(4), 0.0)
                if seq.num_output_tokens >= group.params.max_tokens:
                    scheduler.finish_seq(seq, "length")
            if not group.unfinished_seqs:
                scheduler.finish(group)
                if not group.request_id.startswith("again") and data.draw(st.booleans()):
                    scheduler.add(SequenceGroup(f"again-{group.request_id}", None,
                                                group.prompt_token_ids, group.params))
    assert not scheduler.has_unfinished()
    assert all(block.ref_count == 0 for block in bm.blocks)
    assert bm.num_free_blocks == num_blocks
    assert bm.host.num_free == bm.host.num_blocks
