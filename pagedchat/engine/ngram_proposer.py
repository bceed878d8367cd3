"""N-gram drafting (prompt lookup): the tokens that followed the sequence's own last n tokens
the last time those n tokens occurred in its prompt or output.

Each sequence keeps an index from every n-gram of its tokens (``ngram_min`` to ``ngram_max``
long) to where it last ended, extended as tokens are appended, so a proposal costs a few
dictionary lookups whatever the length of the sequence. The longest n-gram found wins.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from pagedchat.engine.sequence import Sequence


class _Index:
    """The n-grams of one sequence's tokens: n-gram -> the index of the token after its
    latest occurrence that has a token after it."""

    def __init__(self) -> None:
        self.ends: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # tokens[:indexed] have their n-grams ending before them indexed


class NgramProposer:
    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self._indexes: WeakKeyDictionary[Sequence, _Index] = WeakKeyDictionary()

    def propose(self, seq: Sequence, limit: int) -> list[int]:
        """Up to ``limit`` tokens that may follow ``seq``'s tokens; empty without a match."""
        if limit < 1:
            return []
        tokens = seq.token_ids
        index = self._indexes.get(seq)
        if index is None:
            index = self._indexes[seq] = _Index()
        self._extend(index, tokens)
        for n in range(min(self.ngram_max, len(tokens) - 1), self.ngram_min - 1, -1):
            end = index.ends.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end : end + limit]
        return []

    def _extend(self, index: _Index, tokens: list[int]) -> None:
        """Index the n-grams that end before each token not yet indexed, except the last
        (its suffix has no token after it yet)."""
        ends = index.ends
        low, high = self.ngram_min, self.ngram_max
        for end in range(max(index.indexed, 1), len(tokens)):
            for n in range(low, min(high, end) + 1):
                ends[tuple(tokens[end - n : end])] = end
        index.indexed = max(len(tokens), index.indexed)
