"""N-gram drafting (prompt lookup): the tokens that followed the sequence's own last n tokens
the last time those n tokens occurred in its prompt or output.

Each sequence keeps an index from every n-gram of its tokens (``ngram_min`` to ``ngram_max``
long) to where it last ended, extended as tokens are appended, so a proposal costs a few
dictionary lookups whatever the length of the sequence. The longest n-gram found wins; a
match close to the end, in a run that repeats, proposes the run's repetition.

A drafted token costs a query row in the step that verifies it, whether it is accepted or
not, so each sequence proposes only as many tokens as pay for their rows: it keeps a
recent estimate of how likely a drafted token is accepted (once the ones before it were),
and takes the draft length that maximises the expected tokens per step over the step's
cost, as the engine's own steps of that many rows took (``StepCosts``). Without a draft
for a while, the estimate drifts back to its prior, so a sequence that starts to repeat
its context is drafted for again.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from pagedchat.engine.sequence import Sequence
from pagedchat.engine.step_costs import ROW_COST, StepCosts

# how much of its weight an observation of acceptance keeps per step of the sequence
DECAY = 0.8


class _Index:
    """The n-grams of one sequence's tokens: n-gram -> the index of the token after its
    latest occurrence that has a token after it; and its recent drafts' fortune."""

    def __init__(self) -> None:
        self.ends: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # tokens[:indexed] have their n-grams ending before them indexed
        self.accepted = 0.0  # decayed counts of drafted tokens accepted, and of rejections
        self.rejected = 0.0

    def draft_length(self, limit: int, costs: StepCosts) -> int:
        """The draft length (up to ``limit``) with the most expected tokens per unit of
        step cost, each drafted token accepted with the estimated probability (a
        Laplace prior: one half without observations)."""
        p = (self.accepted + 1.0) / (self.accepted + self.rejected + 2.0)
        best, best_rate, expected = 0, 1.0, 1.0
        for k in range(1, limit + 1):
            expected += p**k
            rate = expected / costs.relative(1 + k)
            if rate > best_rate:
                best, best_rate = k, rate
        return best


class NgramProposer:
    def __init__(self, ngram_min: int, ngram_max: int, row_cost: float = ROW_COST) -> None:
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        # what steps of each row count cost (row_cost 0, until timed: always the whole limit)
        self.costs = StepCosts(row_cost)
        self._indexes: WeakKeyDictionary[Sequence, _Index] = WeakKeyDictionary()

    def propose(self, seq: Sequence, limit: int) -> list[int]:
        """Up to ``limit`` tokens that may follow ``seq``'s tokens, as many as are likely to
        pay for their rows; empty without a match."""
        tokens = seq.token_ids
        index = self._indexes.setdefault(seq, _Index())
        index.accepted *= DECAY
        index.rejected *= DECAY
        limit = index.draft_length(limit, self.costs)
        if limit < 1:
            return []
        self._extend(index, tokens)
        for n in range(min(self.ngram_max, len(tokens) - 1), self.ngram_min - 1, -1):
            if (end := index.ends.get(tuple(tokens[-n:]))) is not None:
                return _continuation(tokens, end, limit)
        return []

    def record(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """How the draft of ``drafted`` tokens last proposed for ``seq`` fared."""
        if (index := self._indexes.get(seq)) is not None:
            index.accepted += accepted
            index.rejected += accepted < drafted

    def timed(self, rows: int, seconds: float) -> None:
        """A lone sequence's decode step of ``rows`` query rows took ``seconds``."""
        self.costs.record(rows, seconds)

    def _extend(self, index: _Index, tokens: list[int]) -> None:
        """Index the n-grams that end before each token not yet indexed, except the last
        (its suffix has no token after it yet)."""
        ends = index.ends
        low, high = self.ngram_min, self.ngram_max
        for end in range(max(index.indexed, 1), len(tokens)):
            for n in range(low, min(high, end) + 1):
                ends[tuple(tokens[end - n : end])] = end
        index.indexed = max(len(tokens), index.indexed)


def _continuation(tokens: list[int], end: int, limit: int) -> list[int]:
    """``limit`` tokens continuing ``tokens`` as they went on after ``end``: past the last
    token, the proposal copies itself (a run that repeats with period ``len - end``)."""
    draft = tokens[end : end + limit]
    period = len(tokens) - end
    while len(draft) < limit:
        draft.append(draft[len(draft) - period])
    return draft
