"""Choosing the next token: penalties, greedy, temperature, top-k, top-p, min-p, seeds; and
the per-token log-probabilities of requests that ask for them (SamplingParams.logprobs).

All rows are processed together; only rows with their own seed draw their noise from their
own generator, so a seeded answer does not depend on what else is in the batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedchat.engine.outputs import Logprob
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.kernels import reference

RowReduction = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass
class SampleRow:
    """One sampled sequence: its parameters, history and (optional) own generator."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None
    banned: tuple[int, ...] = ()  # ids masked this step (end of sequence before min_tokens)


def apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """Repetition (transformers' rule, over prompt and output), presence and frequency
    (OpenAI's rule, over the output) penalties, in place on rows that ask for them."""
    for i, row in enumerate(rows):
        p = row.params
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(row.prompt_token_ids) | set(row.output_token_ids)))
            scores = logits[i, seen]
            logits[i, seen] = torch.where(  # bounded: a tiny penalty must not reach inf
                scores > 0, scores / p.repetition_penalty, scores * p.repetition_penalty,
            ).clamp(-1e30, 1e30)
        if (p.presence_penalty or p.frequency_penalty) and row.output_token_ids:
            ids, counts = torch.tensor(row.output_token_ids).unique(return_counts=True)
            logits[i, ids] -= p.frequency_penalty * counts.float() + p.presence_penalty
    return logits


def apply_constraints(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """logit_bias, the banned ids and the logits processors, in place on the rows that
    have them (float32 logits)."""
    for i, row in enumerate(rows):
        p = row.params
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), dtype=torch.int64)
            logits[i].index_add_(0, ids, torch.tensor(list(p.logit_bias.values()),
                                                      dtype=logits.dtype))
        if row.banned:
            logits[i, list(row.banned)] = float("-inf")
        for processor in p.logits_processors:
            logits[i] = processor(row.output_token_ids, logits[i])
    return logits


def filter_logits(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p as masks of -inf."""
    temps = torch.tensor([row.params.temperature for row in rows]).unsqueeze(1)
    logits = logits / temps
    top_k = torch.tensor([row.params.top_k for row in rows])
    if bool((top_k > 0).any()):
        limited = top_k > 0
        k = top_k.clamp(min=1, max=logits.shape[1])
        values = logits.topk(int(k.max()), dim=1).values
        kth = values.gather(1, (k - 1).unsqueeze(1))
        kth[~limited] = float("-inf")
        logits = logits.masked_fill(logits < kth, float("-inf"))
    top_p = torch.tensor([row.params.top_p for row in rows])
    if bool((top_p < 1).any()):
        logits = logits.masked_fill(_outside_top_p(logits, top_p), float("-inf"))
    min_p = torch.tensor([row.params.min_p for row in rows])
    if bool((min_p > 0).any()):
        probs = logits.softmax(dim=1)
        floor = probs.max(dim=1, keepdim=True).values * min_p.unsqueeze(1)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


# Top-p's candidate counts in turn (most rows' mass reaches it in the first), then all.
_TOP_P_CANDIDATES = (256, 4096, 32768)


def _outside_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Tokens outside the smallest most-likely set whose mass reaches ``top_p``, found among
    each row's fewest candidates whose mass reaches it."""
    probs = logits.softmax(dim=1)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    rows = torch.arange(probs.shape[0])
    for count in (*_TOP_P_CANDIDATES, probs.shape[1]):
        values, order = probs[rows].topk(min(count, probs.shape[1]), dim=1)
        mass_before = values.cumsum(dim=1) - values
        covered = (mass_before[:, -1] + values[:, -1] >= top_p[rows]) | (count >= probs.shape[1])
        done, rows = rows[covered], rows[~covered]
        keep[done] = torch.zeros(len(done), probs.shape[1], dtype=torch.bool).scatter_(
            1, order[covered], mass_before[covered] < top_p[done].unsqueeze(1))
        if not len(rows):
            break
    return ~keep


# Logits per slice of rows sampled at once: the float32 copies that penalties and random
# rows take (several per row) stay this small with a vocabulary of any size.
SLICE_LOGITS = 1 << 23


def sample(logits: torch.Tensor, rows: list[SampleRow],
           max_logsumexp: RowReduction = reference.max_logsumexp) -> tuple[list[int], list[float]]:
    """Next token and its log-probability (under the model's own distribution) per row. ``logits``
    are float32 or the model's own lower precision: ``max_logsumexp`` (the kernel backend's, a
    compiled single pass on the CPU) reads them as they are, and only what needs float32 arithmetic
    (penalties, filtering the random rows) widens a copy, a slice of rows at a time."""
    step = max(SLICE_LOGITS // max(logits.shape[1], 1), 1)
    tokens: list[int] = []
    logprobs: list[float] = []
    for start in range(0, len(rows), step):
        chosen, picked = _sample(logits[start:start + step], rows[start:start + step],
                                 max_logsumexp)
        tokens += chosen
        logprobs += picked
    return tokens, logprobs


def processed_logits(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """``logits`` with the rows' penalties and constraints applied (a float32 copy where
    any row has them, else ``logits`` itself)."""
    if any(row.params.repetition_penalty != 1.0 or row.params.presence_penalty
           or row.params.frequency_penalty or row.banned or row.params.logit_bias
           or row.params.logits_processors for row in rows):
        logits = apply_constraints(apply_penalties(logits.to(torch.float32, copy=True), rows), rows)
    return logits


def _sample(logits: torch.Tensor, rows: list[SampleRow], max_logsumexp: RowReduction,
            ) -> tuple[list[int], list[float]]:
    logits = processed_logits(logits, rows)
    # The greedy choice (the first of equal maxima, as argmax), its logit and each row's
    # normaliser: only the chosen tokens' log-probabilities are needed, not a log-softmax.
    top, chosen, normaliser = max_logsumexp(logits)
    random = [i for i, row in enumerate(rows) if not row.params.greedy]
    if random:
        index = torch.tensor(random)
        probs = filter_logits(logits[index].float(), [rows[i] for i in random]).softmax(dim=1)
        # The exponential race, its draws -log(u) in one vectorised logarithm (exponential_
        # takes a scalar one per value); a u of 0 only leaves its token out of this race.
        noise = torch.empty_like(probs)
        for j, i in enumerate(random):  # a row without a generator takes torch's own
            torch.rand(probs.shape[1], generator=rows[i].generator, out=noise[j])
        chosen[index] = (probs / noise.log_().neg_()).argmax(dim=1)
        top = logits.gather(1, chosen.unsqueeze(1)).squeeze(1).float()
    picked = top - normaliser
    return chosen.tolist(), picked.tolist()


def token_logprobs(logits: torch.Tensor, chosen: list[int], ks: list[int],
                   ) -> list[dict[int, Logprob]]:
    """Per row: the chosen token's log-probability and rank, then the ``k`` most likely
    tokens' (the chosen one is not repeated), under the softmax of the row's raw logits."""
    logprobs = logits.float().log_softmax(dim=1)
    index = torch.tensor(chosen, dtype=torch.int64).unsqueeze(1)
    picked = logprobs.gather(1, index)
    ranks = (logprobs > picked).sum(dim=1) + 1
    top_values = top_ids = None
    if max(ks) > 0:
        top_values, top_ids = logprobs.topk(max(ks), dim=1)
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
    entries = []
    for i, (token, k) in enumerate(zip(chosen, ks, strict=True)):
        entry = {token: Logprob(float(picked[i, 0]), int(ranks[i]))}
        for rank in range(k):
            entry.setdefault(top_ids[i][rank], Logprob(top_values[i][rank], rank + 1))
        entries.append(entry)
    return entries
