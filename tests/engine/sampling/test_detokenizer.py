"""Incremental detokenization: the text streamed piece by piece is the text decoded whole."""

from __future__ import annotations

from pagedchat.engine.sampling.detokenizer import IncrementalDetokenizer


def test_detokenizer_never_splits_a_multibyte_character(tiny_llm):
    tokenizer = tiny_llm.tokenizer
    text = "naïve café 🙂 世界 — ok"
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, ids[:1])
    pieces = [detok.step(ids[: i + 1]) for i in range(1, len(ids))]
    assert all("\ufffd" not in piece for piece in pieces)
    assert tokenizer.decode(ids[:1]) + "".join(pieces) == text
