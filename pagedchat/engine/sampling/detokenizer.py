"""Incremental detokenization that never splits a multi-byte character.

Each step decodes a short window (a few tokens already shown plus the new ones) and
emits only the part past what was shown; text ending in U+FFFD means a character is
still incomplete, so nothing is emitted until the next token completes it."""

from __future__ import annotations

_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.prefix_offset = max(len(prompt_token_ids) - _CONTEXT_TOKENS, 0)
        self.read_offset = len(prompt_token_ids)

    def copy(self) -> IncrementalDetokenizer:
        twin = IncrementalDetokenizer.__new__(IncrementalDetokenizer)
        twin.tokenizer = self.tokenizer
        twin.prefix_offset, twin.read_offset = self.prefix_offset, self.read_offset
        return twin

    def step(self, token_ids: list[int]) -> str:
        """New text after ``token_ids`` (the sequence's prompt and output) grew."""
        decode = self.tokenizer.decode
        shown = decode(token_ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        full = decode(token_ids[self.prefix_offset :], skip_special_tokens=True)
        if len(full) > len(shown) and not full.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(token_ids)
            return full[len(shown) :]
        return ""
