"""``response_format`` through xgrammar: a logits processor masking every token the JSON
grammar does not allow next. A request's processor serves all its sequences (n > 1): each call
finds the matcher whose accepted tokens begin the sequence's history and feeds it the rest, or
starts a new one when histories part."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import xgrammar


class Grammars:
    """Compiles grammars for one (transformers) tokenizer, loaded with its table at first use."""

    def __init__(self, load_tokenizer: Callable[[], Any], vocab_size: int,
                 stop_token_ids: list[int]) -> None:
        self._load_tokenizer = load_tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = stop_token_ids
        self._compiler = None
        self._lock = threading.Lock()

    def compile(self, kind: str, schema: dict[str, Any] | None) -> xgrammar.CompiledGrammar:
        """``kind`` json_object (any JSON object) or json_schema; raises ValueError for a
        schema xgrammar cannot read. Blocking: call it off the event loop."""
        import xgrammar

        with self._lock:
            if self._compiler is None:
                info = xgrammar.TokenizerInfo.from_huggingface(
                    self._load_tokenizer(), vocab_size=self._vocab_size,
                    stop_token_ids=self._stop_token_ids)
                self._compiler = xgrammar.GrammarCompiler(info)
        # compact JSON: a model cannot pad it with whitespace until max_tokens
        text = json.dumps(schema if kind == "json_schema" else {"type": "object"})
        try:
            return self._compiler.compile_json_schema(text, any_whitespace=False)
        except Exception as error:  # xgrammar raises RuntimeError for a bad schema
            raise ValueError(f"response_format: cannot use this JSON schema ({error})") from error


class GrammarProcessor:
    """The logits processor of one request (see the module docstring)."""

    def __init__(self, grammar: xgrammar.CompiledGrammar, vocab_size: int) -> None:
        import xgrammar

        self._xgr = xgrammar
        self._grammar = grammar
        self._mask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self._matchers: list[tuple[xgrammar.GrammarMatcher, list[int]]] = []

    def __call__(self, history: list[int], row: torch.Tensor) -> torch.Tensor:
        matcher = self._matcher_for(history)
        matcher.fill_next_token_bitmask(self._mask)
        self._xgr.apply_token_bitmask_inplace(row.unsqueeze(0), self._mask)
        return row

    def _matcher_for(self, history: list[int]):
        for matcher, seen in self._matchers:
            if seen == history[: len(seen)] and self._feed(matcher, seen, history):
                return matcher
        matcher = self._xgr.GrammarMatcher(self._grammar)
        seen: list[int] = []
        self._feed(matcher, seen, history)
        self._matchers.append((matcher, seen))
        return matcher

    @staticmethod
    def _feed(matcher, seen: list[int], history: list[int]) -> bool:
        for token in history[len(seen):]:
            if not matcher.accept_token(token):
                return False
            seen.append(token)
        return True
