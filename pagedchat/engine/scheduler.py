"""Iteration-level scheduling: who runs this step, with how many tokens.

There is no prefill or decode phase: each sequence has ``num_computed_tokens``, and a step
spends a token budget on running groups first (oldest first), then swapped ones, then
waiting ones, first come first served; a long prompt is prefilled in chunks beside running
decodes. When blocks run out, the newest running group is preempted, all or nothing, and
nothing new is admitted that step. First, every running sequence gives back the blocks that
slid out of its local layers' windows."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from pagedchat.engine.block_manager import BlockManager
from pagedchat.engine.blocks import NO_HIT, PrefixHit
from pagedchat.engine.config import EngineConfig
from pagedchat.engine.fits import RequestFit
from pagedchat.engine.ngram_proposer import NgramProposer
from pagedchat.engine.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedchat.engine.step_input import StepInput


@dataclass
class ScheduledSeq:
    group: SequenceGroup
    seq: Sequence
    num_new_tokens: int
    samples: bool
    draft: list[int] = field(default_factory=list)  # proposed tokens, after the real ones
    # computing nothing, its whole prompt cached: the runner's slot keeping its last row
    kept_slot: int | None = None
    keep_slot: int | None = None  # the slot where the runner keeps its last row's state


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[SequenceGroup] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(item.num_new_tokens for item in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def step_input(self, block_size: int) -> StepInput:
        """The step as the runner takes it: the scheduled sequences flattened, prefill
        chunks and decodes side by side, with slots and tables per layer group. The sampled
        rows are each plain sequence's last (a kept row for one computing nothing), then
        every row of each sequence with a draft (its last real token's and its draft's)."""
        token_chunks, position_chunks = [], [np.empty(0, np.int64)]
        context_lens, query_start, sample_rows, draft_rows = [], [0], [], []
        keep, from_kept = [], []
        computing = [item for item in self.scheduled if item.num_new_tokens]
        num_groups = len(self.scheduled[0].seq.block_tables)
        slot_chunks = [[np.empty(0, np.int64)] for _ in range(num_groups)]
        max_blocks = max((len(item.seq.block_tables[0]) for item in computing), default=0)
        tables = np.full((num_groups, len(computing), max_blocks), -1, dtype=np.int32)
        for item in self.scheduled:
            if not item.num_new_tokens:
                from_kept.append((len(sample_rows), item.kept_slot))
                sample_rows.append(-1)
                continue
            seq, i = item.seq, len(context_lens)
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            positions = np.arange(start, end)
            index, offset = positions // block_size, positions % block_size
            for group, block_table in enumerate(seq.block_tables):
                table = np.asarray(block_table, dtype=np.int64)
                tables[group, i, : len(table)] = table
                slot_chunks[group].append(table[index] * block_size + offset)
            token_chunks.append(seq.token_ids[start : end - len(item.draft)] + item.draft)
            position_chunks.append(positions)
            context_lens.append(end)
            query_start.append(query_start[-1] + item.num_new_tokens)
            if item.draft:
                draft_rows.extend(range(query_start[-1] - 1 - len(item.draft), query_start[-1]))
            elif item.samples:
                if item.keep_slot is not None:
                    keep.append((len(sample_rows), item.keep_slot))
                sample_rows.append(query_start[-1] - 1)
        return StepInput(
            input_ids=np.fromiter((t for chunk in token_chunks for t in chunk), dtype=np.int64),
            positions=np.concatenate(position_chunks),
            slot_mapping=np.stack([np.concatenate(chunks) for chunks in slot_chunks]),
            block_tables=tables, context_lens=np.asarray(context_lens, dtype=np.int32),
            query_start_loc=np.asarray(query_start, dtype=np.int32),
            sample_rows=sample_rows + draft_rows,
            copies=self.copies, swap_out=self.swap_out, swap_in=self.swap_in,
            keep=keep, from_kept=from_kept)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config, self.block_manager = config, block_manager
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.swapped: deque[SequenceGroup] = deque()
        self.num_preemptions = 0
        self.proposer = (NgramProposer(config.ngram_min, config.ngram_max)
                         if config.speculative == "ngram" else None)
        self.draft_tokens = self.accepted_tokens = 0
        # the rule by which add_request refuses a request that could never run
        bm = block_manager
        self.fit = RequestFit(bm.block_size, bm.windows, config.max_model_len,
                              config.max_num_batched_tokens, config.max_num_seqs, bm.num_blocks)

    def add(self, group: SequenceGroup) -> None:
        self.waiting.append(group)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def groups(self) -> list[SequenceGroup]:
        return [*self.running, *self.swapped, *self.waiting]

    def num_running_seqs(self) -> int:
        return sum(len(group.unfinished_seqs) for group in self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        if self.block_manager.has_windows:
            for group in self.running:
                for seq in group.unfinished_seqs:
                    self.block_manager.slide(seq)
        index = 0
        while index < len(self.running) and budget > 0:
            group = self.running[index]
            plan = self._plan(group, budget)
            while plan and not self._allocate(plan):
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is group:
                    plan = []
            if group not in self.running:
                break
            out.scheduled.extend(plan)
            budget -= sum(item.num_new_tokens for item in plan)
            index += 1
        if not out.preempted:
            budget = self._resume_swapped(out, budget)
            if not self.swapped:
                self._admit_waiting(out, budget)
            if self.proposer is not None:
                self._add_drafts(out)
        self._keep_prompt_rows(out)
        out.copies = self.block_manager.take_copies()
        return out

    def _keep_prompt_rows(self, out: SchedulerOutput) -> None:
        """Give each prompt whose last row this step samples a slot where the runner keeps
        that row's hidden state, so that the same prompt again (a regenerated reply) can
        compute nothing; the slots' prompts are forgotten with the prefix cache."""
        bm = self.block_manager
        if not bm.enable_prefix_caching:
            return
        items = [item for item in out.scheduled if item.samples and item.num_new_tokens
                 and not item.draft and not item.seq.num_output_tokens]
        slots = bm.kept_rows.keep([tuple(item.seq.token_ids) for item in items])
        for item, slot in zip(items, slots, strict=True):
            item.keep_slot = slot

    def _add_drafts(self, out: SchedulerOutput) -> None:
        """Give each decoding sequence the proposer's draft, with the budget and blocks left
        once everything else is scheduled: speculation never holds back a request, causes a
        preemption or evicts a cached prefix. A sequence without a match decodes plainly."""
        bm = self.block_manager
        budget = self.config.max_num_batched_tokens - out.num_batched_tokens
        for item in out.scheduled:
            group, seq = item.group, item.seq
            if (budget < 1 or not item.samples or item.num_new_tokens != 1 or not group.forked
                    or seq.num_tokens - seq.num_computed_tokens != 1):
                continue
            end = min(len(group.prompt_token_ids) + group.params.max_tokens,
                      self.config.max_model_len)
            draft = self.proposer.propose(
                seq, min(self.config.num_speculative_tokens, budget, end - seq.num_tokens - 1))
            while draft and bm.blocks_needed(seq, 1 + len(draft)) > len(bm.free_ids):
                draft.pop()
            if not draft:
                continue
            if not bm.allocate_slots(seq, 1 + len(draft)):
                raise AssertionError("block accounting disagreed with allocation")
            item.draft = draft
            item.num_new_tokens += len(draft)
            budget -= len(draft)
            self.draft_tokens += len(draft)
            group.metrics.draft_tokens += len(draft)

    def settle_draft(self, group: SequenceGroup, seq: Sequence, draft: int, appended: int) -> None:
        """After a step that verified ``draft`` proposed tokens of ``seq`` and appended
        ``appended`` tokens: the K/V of the rejected ones are dropped (their computed count
        and the blocks only they filled), and the blocks now full of final tokens are cached."""
        accepted = appended - 1
        self.accepted_tokens += accepted
        group.metrics.accepted_tokens += accepted
        self.proposer.record(seq, draft, accepted)
        if seq.is_finished:
            return
        seq.num_computed_tokens -= draft - accepted
        self.block_manager.truncate(seq)
        self.block_manager.cache_full_blocks(seq)

    def _plan(
        self, group: SequenceGroup, budget: int, cached: dict[int, PrefixHit] | None = None
    ) -> list[ScheduledSeq]:
        """How many tokens each sequence of ``group`` computes this step. ``cached`` maps a
        fresh sequence to the prefix-cache blocks it will take (one covering every token with
        a kept row computes nothing). A group samples only when all its sequences are caught
        up in the same step; a lone sequence may take a chunk of its prompt instead."""
        seqs = group.unfinished_seqs
        cached = cached or {}
        hits = [cached.get(s.seq_id, NO_HIT) for s in seqs]
        remaining = [s.num_tokens - s.num_computed_tokens - hit.num_tokens
                     for s, hit in zip(seqs, hits, strict=True)]
        if sum(remaining) <= budget:
            return [ScheduledSeq(group, s, r, True, kept_slot=hit.kept_slot)
                    for s, r, hit in zip(seqs, remaining, hits, strict=True)]
        if len(seqs) == 1:
            return [ScheduledSeq(group, seqs[0], budget, False)] if budget > 0 else []
        plan = []
        for seq, left in zip(seqs, remaining, strict=True):
            take = min(left - 1, budget)
            if take > 0:
                plan.append(ScheduledSeq(group, seq, take, False))
                budget -= take
        return plan

    def _allocate(self, plan: list[ScheduledSeq],
                  cached: dict[int, PrefixHit] | None = None) -> bool:
        """Allocate slots for every sequence of ``plan`` (in every layer group) or for none."""
        bm = self.block_manager
        cached = cached or {}
        refs: dict[int, int] = {}
        hits = {block_id for prefix in cached.values() for block_id in prefix.block_ids()}
        need = bm.evictable_taken(hits)
        for item in plan:
            prefix = cached.get(item.seq.seq_id, NO_HIT)
            need += bm.blocks_needed(item.seq, item.num_new_tokens, prefix, refs)
        if need > bm.num_free_blocks:
            return False
        # the hits of every sequence first: a block one of them takes is never evicted to
        # make room for another's
        bm.hold(hits)
        for item in plan:
            prefix = cached.get(item.seq.seq_id, NO_HIT)
            if not bm.allocate_slots(item.seq, item.num_new_tokens, prefix):
                raise AssertionError("block accounting disagreed with allocation")
            bm.cache_full_blocks(item.seq, item.seq.num_computed_tokens + item.num_new_tokens)
        return True

    def _preempt(self, group: SequenceGroup, out: SchedulerOutput) -> None:
        self.num_preemptions += 1
        out.preempted.append(group)
        seqs = group.unfinished_seqs
        bm = self.block_manager
        if self.config.preemption_mode == "swap" and bm.can_swap_out(seqs):
            out.swap_out.extend(bm.swap_out(seqs))
            for seq in seqs:
                seq.status = SequenceStatus.SWAPPED
            group.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(group)
            return
        for seq in seqs:
            bm.free(seq)
            seq.status = SequenceStatus.WAITING
        group.status = SequenceStatus.WAITING
        self.waiting.appendleft(group)

    def _resume_swapped(self, out: SchedulerOutput, budget: int) -> int:
        bm = self.block_manager
        while self.swapped and budget > 0:
            group = self.swapped[0]
            seqs = group.unfinished_seqs
            if self.num_running_seqs() + len(seqs) > self.config.max_num_seqs:
                break
            if not bm.can_swap_in(seqs, reserve=2 * len(seqs)):
                break
            self.swapped.popleft()
            out.swap_in.extend(bm.swap_in(seqs))
            for seq in seqs:
                seq.status = SequenceStatus.RUNNING
            group.status = SequenceStatus.RUNNING
            self.running.append(group)
            plan = self._plan(group, budget)
            if plan and self._allocate(plan):
                out.scheduled.extend(plan)
                budget -= sum(item.num_new_tokens for item in plan)
        return budget

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0:
            group = self.waiting[0]
            if self.num_running_seqs() + group.max_seqs > self.config.max_num_seqs:
                break
            cached = {seq.seq_id: bm.find_cached_prefix(seq) for seq in group.unfinished_seqs}
            plan = self._plan(group, budget, cached)
            if not plan or not self._allocate(plan, cached):
                break
            self.waiting.popleft()
            group.status = SequenceStatus.RUNNING
            for seq in group.unfinished_seqs:
                seq.status = SequenceStatus.RUNNING
            hits = max(prefix.num_tokens for prefix in cached.values())
            group.num_cached_tokens = max(group.num_cached_tokens, hits)
            self.running.append(group)
            out.scheduled.extend(plan)
            budget -= sum(item.num_new_tokens for item in plan)

    # ---- forks and endings: the only changes to block tables outside a schedule ---
    def fork(self, parent: Sequence, index: int) -> Sequence:
        """A new sequence continuing ``parent`` (a sample or a beam) that shares every block
        of it; a later write into a shared block copies it."""
        child = parent.fork(index)
        self.block_manager.fork(parent, child)
        return child

    def finish_seq(self, seq: Sequence, reason: str) -> None:
        """End one sequence (stop, length, a pruned beam) and free its blocks at once."""
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        self.block_manager.free(seq)

    def finish(self, group: SequenceGroup) -> None:
        """Free every block of a group that ended and drop it from its queue."""
        for seq in group.seqs:
            self.block_manager.free(seq)
        group.status = SequenceStatus.FINISHED
        for queue in (self.running, self.waiting, self.swapped):
            if group in queue:
                queue.remove(group)

    def abort(self, group: SequenceGroup, reason: str = "abort") -> None:
        """End every unfinished sequence of ``group`` with ``reason`` and finish the group."""
        for seq in group.unfinished_seqs:
            seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        self.finish(group)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (a benchmark's next round starts cold)."""
        self.block_manager.reset_prefix_cache()

    def find(self, request_id: str) -> SequenceGroup | None:
        for group in self.groups():
            if group.request_id == request_id:
                return group
        return None
