"""Verifying drafted tokens: a sequence's last real token and its draft ran as rows of one
step; its tokens are appended row by row, as plain decode steps would have appended them,
until one differs from the draft (or the sequence ends); then the rejected rows' K/V are
rolled back (``Scheduler.settle_draft``).

Row j's logits are those of the sequence with the draft's first j tokens appended, which
are exactly the tokens appended before row j is read: so greedy choices are the ones a plain
decode makes, and a sampled row draws from the same target distribution (penalties,
constraints and min_tokens see the same history). A drafted row's sampled token goes through
the acceptance test of speculative sampling (``sampling/rejection.py``); the last row, after
a fully accepted draft, is sampled plainly."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from pagedchat.engine.sampling.rejection import accept_draft
from pagedchat.engine.sampling.sampler import SampleRow, filter_logits, processed_logits, sample
from pagedchat.engine.scheduler import ScheduledSeq, Scheduler
from pagedchat.engine.sequence import Sequence, SequenceGroup

if TYPE_CHECKING:
    from pagedchat.engine.runner.protocol import Runner
    from pagedchat.engine.sampling_params import SamplingParams


class Engine(Protocol):
    """What verifying drafts asks of the engine (an ``LLMEngine``, whose module imports
    this one): the steps a plain decode's token goes through."""

    scheduler: Scheduler
    runner: Runner

    def _after_token(self, group: SequenceGroup, seq: Sequence) -> None: ...
    def _fail(self, group: SequenceGroup, error: Exception) -> None: ...
    def _banned(self, params: SamplingParams, seq: Sequence) -> tuple[int, ...]: ...
    @staticmethod
    def _record_logprobs(logits: torch.Tensor, rows: list[SampleRow],
                         seqs: list[tuple[SequenceGroup, Sequence]], tokens: list[int],
                         ) -> None: ...


def verify_drafts(engine: Engine, items: list[ScheduledSeq], argmax: list[bool],
                  tokens: list[int], logits: torch.Tensor) -> list[SequenceGroup]:
    """Append each drafted sequence's accepted tokens and one more. ``argmax[i]``: item i's
    rows' greedy tokens are the next ``1 + len(draft)`` of ``tokens``; else its rows are
    the next of ``logits``. Returns the groups that advanced."""
    advanced = []
    token_at = logit_at = 0
    for item, greedy_head in zip(items, argmax, strict=True):
        group, seq, draft = item.group, item.seq, item.draft
        rows = 1 + len(draft)
        advanced.append(group)
        if greedy_head:
            chosen = tokens[token_at : token_at + rows]
            token_at += rows
        else:
            item_logits = logits[logit_at : logit_at + rows]
            logit_at += rows
        if group.error is not None:
            continue
        try:
            appended = 0
            for j in range(rows):
                proposed = draft[j] if j < len(draft) else None
                if greedy_head:
                    token, logprob = chosen[j], None
                else:
                    token, logprob = _choose(engine, group, item, item_logits[j : j + 1], proposed)
                seq.append_token(token, logprob)
                appended += 1
                engine._after_token(group, seq)
                if seq.is_finished or token != proposed:
                    break
            engine.scheduler.settle_draft(group, seq, len(draft), appended)
        except Exception as error:
            engine._fail(group, error)
    return advanced


def _choose(engine: Engine, group: SequenceGroup, item: ScheduledSeq, logits: torch.Tensor,
            proposed: int | None) -> tuple[int, float]:
    """The token of one row (``logits``: [1, vocab]) and its log-probability, as the
    sampler gives them; a drafted row of a sampled request through the acceptance test."""
    params, seq = group.params, item.seq
    row = SampleRow(params, group.prompt_token_ids, seq.output_token_ids, group.generator,
                    engine._banned(params, seq))
    max_logsumexp = engine.runner.kernels.max_logsumexp
    if proposed is None or params.greedy:
        [token], [logprob] = sample(logits, [row], max_logsumexp)
    else:
        processed = processed_logits(logits, [row])
        probs = filter_logits(processed.float(), [row]).softmax(dim=1)[0]
        token = accept_draft(probs, proposed, group.generator)
        _, _, normaliser = max_logsumexp(processed)
        logprob = float(processed[0, token].float() - normaliser[0])
    engine._record_logprobs(logits, [row], [(group, seq)], [token])
    return token, logprob
