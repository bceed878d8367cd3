"""N-gram drafting (prompt lookup): the tokens that followed the sequence's own last n tokens
the last time those n tokens occurred in its prompt or output.

Each sequence keeps an index from every n-gram of its tokens (``ngram_min`` to ``ngram_max``
long) to where it last ended, extended as tokens are appended, so a proposal costs a few
dictionary lookups. The longest n-gram found wins; a match close to the end, in a run that
repeats, proposes the run's repetition.

A drafted token costs a query row whether it is accepted or not, so a draft is only as long
as pays for its rows. Acceptance depends most on the length of the match behind the draft
(a lone token recurs by chance; eight in a row mean the reply is quoting), and a draft's
first token is the doubtful one: per match length, the proposer estimates how often a first
token and a later one are accepted (``_Fortune``), and takes the length with the most
expected tokens per unit of step cost (``StepCosts``). Each lookup of a match length decays
its estimate towards the prior, so a length whose drafts stopped being proposed is retried."""

from __future__ import annotations

from weakref import WeakKeyDictionary

from pagedchat.engine.sequence import Sequence
from pagedchat.engine.step_costs import ROW_COST, StepCosts

# how much of its weight an observation keeps each time its match length is looked up
DECAY = 0.9


class _Fortune:
    """Decayed counts of how the drafts behind matches of one length fared: their first
    tokens tried and accepted, and their later tokens tried (reached with all before them
    accepted) and accepted."""

    def __init__(self) -> None:
        self.first = [0.0, 0.0]  # accepted, tried
        self.later = [0.0, 0.0]

    def forget(self) -> None:
        for counts in (self.first, self.later):
            counts[0] *= DECAY
            counts[1] *= DECAY

    def record(self, drafted: int, accepted: int) -> None:
        reached = min(accepted + 1, drafted)  # drafted tokens compared with the target's
        self.first[0] += accepted >= 1
        self.first[1] += 1
        self.later[0] += max(accepted - 1, 0)
        self.later[1] += reached - 1

    def draft_length(self, limit: int, costs: StepCosts) -> int:
        """The draft length (up to ``limit``) with the most expected tokens per unit of step cost.
        The first token's estimate has a Laplace prior (one half without observations); a later
        token's is drawn towards the first's, which it is taken to equal until observed."""
        first = (self.first[0] + 1.0) / (self.first[1] + 2.0)
        later = (self.later[0] + 2.0 * first) / (self.later[1] + 2.0)
        best, best_rate, expected, reach = 0, 1.0, 1.0, first
        for k in range(1, limit + 1):
            expected += reach
            reach *= later
            rate = expected / costs.relative(1 + k)
            if rate > best_rate:
                best, best_rate = k, rate
        return best


class _Index:
    """The n-grams of one sequence's tokens: n-gram -> the index of the token after its
    latest occurrence that has a token after it; and the length of its last draft's match."""

    def __init__(self) -> None:
        self.ends: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # tokens[:indexed] have their n-grams ending before them indexed
        self.matched = 0  # the match length behind the last draft proposed


class NgramProposer:
    def __init__(self, ngram_min: int, ngram_max: int, row_cost: float = ROW_COST) -> None:
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        # what steps of each row count cost (row_cost 0, until timed: always the whole limit)
        self.costs = StepCosts(row_cost)
        self._fortunes = {n: _Fortune() for n in range(ngram_min, ngram_max + 1)}
        self._indexes: WeakKeyDictionary[Sequence, _Index] = WeakKeyDictionary()

    def propose(self, seq: Sequence, limit: int) -> list[int]:
        """Up to ``limit`` tokens that may follow ``seq``'s tokens, as many as are likely to
        pay for their rows; empty without a match."""
        if limit < 1:
            return []
        tokens = seq.token_ids
        index = self._indexes.setdefault(seq, _Index())
        self._extend(index, tokens)
        for n in range(min(self.ngram_max, len(tokens) - 1), self.ngram_min - 1, -1):
            if (end := index.ends.get(tuple(tokens[-n:]))) is not None:
                fortune = self._fortunes[n]
                fortune.forget()
                length = fortune.draft_length(limit, self.costs)
                index.matched = n
                return _continuation(tokens, end, length) if length else []
        return []

    def record(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """How the draft of ``drafted`` tokens last proposed for ``seq`` fared."""
        if (index := self._indexes.get(seq)) is not None and drafted:
            self._fortunes[index.matched].record(drafted, accepted)

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
