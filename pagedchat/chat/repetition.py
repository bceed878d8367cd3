"""The repetition guard: a reply that has begun to repeat itself word for word (a small
model's loop) is stopped instead of running to max_tokens."""

from __future__ import annotations

LONGEST_PERIOD = 100  # tokens in the longest repeating unit looked for
SHORTEST_SPAN = 48  # tokens of repetition that count as a loop, whatever the unit
REPEATS = 3  # a unit must be seen this many times in a row


def repeating(token_ids: list[int]) -> bool:
    """Whether the tokens end in a unit of up to LONGEST_PERIOD tokens seen REPEATS times in
    a row, over at least SHORTEST_SPAN tokens: "the the the ..." or a sentence said again
    and again. A reply that merely reuses words or a short phrase does not count."""
    count = len(token_ids)
    for period in range(1, LONGEST_PERIOD + 1):
        span = max(REPEATS * period, SHORTEST_SPAN)
        if span > count:
            break
        tail = token_ids[count - span:]
        if tail[period:] == tail[:-period]:
            return True
    return False
