"""Multi-sequence groups keep the block manager's invariants: forking n samples,
decoding with copy-on-write, beam steps that fork and prune, swapping whole groups.

The machine extends test_block_manager's: its invariants (every block in exactly one
state, ref counts equal to table references, hashes matching contents) are checked
after every rule, and its teardown checks that the pool balances once all end. Its
single-sequence rules keep running alongside, so groups also meet strangers' blocks.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import precondition, rule

from pagedchat.engine.config import EngineConfig
from pagedchat.engine.sampling.beam_search import Candidate, fork_beams
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.engine.scheduler import ScheduledSeq, Scheduler
from pagedchat.engine.sequence import Sequence, SequenceGroup
from tests.engine.test_block_manager import (
    BLOCK_SIZE,
    BlockManagerMachine,
    _held,
    _sharing_shape,
)


class GroupMachine(BlockManagerMachine):
    def __init__(self) -> None:
        super().__init__()
        self.scheduler = Scheduler(EngineConfig(block_size=BLOCK_SIZE), self.bm)
        self.groups: list[list[Sequence]] = []

    def _live_groups(self) -> list[list[Sequence]]:
        """Groups whose sequences are all running (the base rules may free or swap some)."""
        return [g for g in self.groups if g and all(seq in self.running for seq in g)]

    def _allocate_group(self, group: list[Sequence]) -> bool:
        """Slots for every sequence's uncomputed tokens, all or nothing, as the scheduler
        does; then the step computes them."""
        owner = SequenceGroup("g", None, group[0].token_ids[:1], SamplingParams())
        plan = [ScheduledSeq(owner, seq, seq.num_tokens - seq.num_computed_tokens, True)
                for seq in group]
        starts = [seq.num_computed_tokens for seq in group]
        if not self.scheduler._allocate(plan):
            return False
        for seq, start in zip(group, starts, strict=True):
            self._written_blocks_are_private(seq, start)
            self._compute(seq)
        return True

    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=14), n=st.integers(2, 4))
    def start_group(self, prompt, n):
        parent = Sequence(prompt, len(prompt))
        cached = self.bm.find_cached_prefix(parent)
        if not self.bm.allocate_slots(parent, len(prompt) - cached.num_tokens, cached):
            return
        self._written_blocks_are_private(parent, cached.num_tokens)
        self._compute(parent)
        before = [self.bm.blocks[b].ref_count for b in _held([parent], "block_tables")]
        group = [parent]
        for index in range(1, n):
            group.append(parent.fork(index))
            self.bm.fork(parent, group[-1])
        after = [self.bm.blocks[b].ref_count for b in _held([parent], "block_tables")]
        assert after == [count + n - 1 for count in before]
        self.running.extend(group[1:])
        self.running.append(parent)
        self.groups.append(group)

    @precondition(lambda self: self._live_groups())
    @rule(data=st.data())
    def decode_group(self, data):
        group = data.draw(st.sampled_from(self._live_groups()))
        for seq in group:
            seq.token_ids.append(data.draw(st.integers(0, 2)))
        if not self._allocate_group(group):
            for seq in group:
                seq.token_ids.pop()

    @precondition(lambda self: self._live_groups())
    @rule(data=st.data())
    def beam_step(self, data):
        """Each new beam extends a parent drawn at random: some fork, some die. If the
        new tokens find no room, the group is preempted by recompute (all freed)."""
        group = data.draw(st.sampled_from(self._live_groups()))
        parents = data.draw(st.lists(st.integers(0, len(group) - 1), min_size=len(group),
                                     max_size=len(group)))
        tokens = data.draw(st.lists(st.integers(0, 2), min_size=len(group),
                                    max_size=len(group)))
        picks = [Candidate(p, t, 0.0, False) for p, t in zip(parents, tokens, strict=True)]
        beams = fork_beams(self.scheduler, group, picks)
        for index, seq in enumerate(group):
            if index not in parents:
                assert seq.block_tables == []
                self.running.remove(seq)
        self.running.extend(seq for seq in beams if seq not in self.running)
        self.groups[self.groups.index(group)] = beams
        if not self._allocate_group(beams):
            for seq in beams:
                self.bm.free(seq)
                self.running.remove(seq)
            self.groups.remove(beams)

    @precondition(lambda self: self._live_groups())
    @rule(data=st.data())
    def swap_out_whole_group(self, data):
        group = data.draw(st.sampled_from(self._live_groups()))
        if not self.bm.can_swap_out(group):
            return
        shape = _sharing_shape(group, "block_tables")
        self._swap_out(group)
        assert _sharing_shape(group, "cpu_block_tables") == shape
        for seq in group:
            self.running.remove(seq)
        self.swapped.append(group)


TestGroupSharing = GroupMachine.TestCase
TestGroupSharing.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
