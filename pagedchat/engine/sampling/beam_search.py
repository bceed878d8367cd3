"""Beam search, one step at a time, on sequences that share KV blocks.

A beam group runs ``k`` sequences (its live beams). Each step the log-probabilities
of all live beams are scored together and the beams are replaced by the best ``k``
continuations; a beam with several continuations forks (its blocks are shared, a
later write into a shared block copies it), a beam with none frees its blocks at once.

The selection is transformers' (5.x ``_beam_search``), so results match
``generate(num_beams=k, do_sample=False, ...)`` on the same logits:
- candidates are the top ``max(2, 1 + #eos) * k`` of beams x vocabulary by cumulative
  log-probability (summed in float32), so that ``k`` of them never end;
- the next beams are the best ``k`` candidates that do not end (EOS or length limit);
- an ending candidate among the top ``k`` becomes a finished hypothesis scored
  ``logprob / generated_len ** length_penalty`` (EOS counted in the length); the best
  ``k`` hypotheses are kept;
- the search stops when every candidate ends, when ``k`` hypotheses exist and
  ``early_stopping is True``, or when ``k`` exist and the best live beam cannot beat
  the worst of them (its score at the current length, or at the length limit when
  ``early_stopping == "never"`` and ``length_penalty > 0``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedchat.engine.scheduler import Scheduler
from pagedchat.engine.sequence import BeamHypothesis, Sequence, SequenceGroup


@dataclass
class Candidate:
    beam: int  # index of the live beam it extends
    token: int
    logprob: float  # cumulative, a float32 value
    ends: bool


def penalised(logprob: float, length: int, length_penalty: float) -> float:
    """transformers' hypothesis score, computed in float32 as it does."""
    return (torch.tensor(logprob, dtype=torch.float32) / (length**length_penalty)).item()


def top_candidates(logprobs: torch.Tensor, beam_logprobs: list[float], num_keep: int
                   ) -> list[tuple[int, int, float]]:
    """The best ``num_keep`` (beam, token, cumulative log-prob), best first."""
    scores = logprobs.float() + torch.tensor(beam_logprobs, dtype=torch.float32).unsqueeze(1)
    vocab = logprobs.shape[1]
    values, flat = scores.flatten().topk(min(num_keep, scores.numel()))
    return [(i // vocab, i % vocab, v) for i, v in zip(flat.tolist(), values.tolist(), strict=True)]


def beam_step(
    group: SequenceGroup, logprobs: torch.Tensor, eos_ids: set[int], max_new_tokens: int
) -> tuple[list[Candidate], bool]:
    """Score one step of ``group``'s live beams (rows of ``logprobs`` in ``group.seqs``
    order); add the hypotheses that finish to ``group.beam_hypotheses``.

    Returns the next live beams, best first, and whether the search is over."""
    params = group.params
    width, penalty = params.best_of, params.length_penalty  # best_of: the beam width
    beams = group.seqs
    length = beams[0].num_output_tokens + 1  # generated tokens once this step's is added
    keep = max(2, 1 + len(eos_ids)) * width
    candidates = [
        Candidate(beam, token, logprob, token in eos_ids or length >= max_new_tokens)
        for beam, token, logprob in top_candidates(
            logprobs, [seq.cumulative_logprob for seq in beams], keep)]
    hypotheses = group.beam_hypotheses
    for c in candidates[:width]:
        if c.ends:
            seq = beams[c.beam]
            hypotheses.append(BeamHypothesis(
                [*seq.output_token_ids, c.token], c.logprob, penalised(c.logprob, length, penalty),
                "stop" if c.token in eos_ids else "length"))
    hypotheses.sort(key=lambda h: -h.score)  # stable: older first on a tie
    del hypotheses[width:]
    running = [c for c in candidates if not c.ends][:width]
    if not running:
        return running, True
    if len(hypotheses) < width:
        return running, False
    if params.early_stopping is True:
        return running, True
    horizon = max_new_tokens if params.early_stopping == "never" and penalty > 0 else length
    best_possible = penalised(running[0].logprob, horizon, penalty)
    return running, not best_possible > hypotheses[-1].score


def fork_beams(scheduler: Scheduler, beams: list[Sequence], picks: list[Candidate]
               ) -> list[Sequence]:
    """The next live beams: each pick extends its parent by one token. A parent picked
    more than once forks (sharing its blocks); a parent not picked is finished as
    "pruned" and its blocks are freed now. The scheduler does both."""
    children: dict[int, list[int]] = {}
    for position, pick in enumerate(picks):
        children.setdefault(pick.beam, []).append(position)
    new: list[Sequence | None] = [None] * len(picks)
    for index, parent in enumerate(beams):
        if not (positions := children.get(index)):
            scheduler.finish_seq(parent, "pruned")
            continue
        for position in positions[1:]:
            new[position] = scheduler.fork(parent, position)
        parent.index = positions[0]
        new[positions[0]] = parent
    for seq, pick in zip(new, picks, strict=True):
        seq.token_ids.append(pick.token)
        seq.cumulative_logprob = pick.logprob
    return new
