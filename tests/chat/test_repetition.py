"""The repetition guard stops a reply that loops, and no other."""

from __future__ import annotations

import random

from pagedchat.chat.repetition import SHORTEST_SPAN, repeating


def test_a_loop_of_any_unit_up_to_100_tokens_is_caught():
    assert repeating([7] * SHORTEST_SPAN)
    assert not repeating([7] * (SHORTEST_SPAN - 1))  # too short yet to count
    sentence = list(range(100, 113))  # 13 tokens, said again and again
    assert repeating([1, 2, 3] + sentence * 4)
    paragraph = list(range(500, 590))  # 90 tokens, three times
    assert repeating(paragraph * 3) and not repeating(paragraph * 2)


def test_ordinary_text_is_not_a_loop():
    rng = random.Random(0)
    prose = [rng.randrange(1000) for _ in range(2000)]
    assert not any(repeating(prose[:end]) for end in range(0, 2000, 7))
    phrase = [5, 6, 7, 8]  # a phrase used twice, words reused: not a loop
    assert not repeating(prose[:60] + phrase + prose[60:80] + phrase)
