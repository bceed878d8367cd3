"""SamplingParams: how one request's tokens are chosen and when it stops."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedchat.engine.errors import RequestError

if TYPE_CHECKING:
    import torch

# (output token ids so far, one row of logits) -> that row, changed; see logits_processors
LogitsProcessor = Callable[[list[int], "torch.Tensor"], "torch.Tensor"]
MAX_LOGPROBS = 20
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1  # what a torch int64 tensor holds
SEED_MIN, SEED_MAX = INT_MIN, (1 << 64) - 1  # what torch.Generator.manual_seed takes
GREEDY_BELOW = 1e-5  # a lower temperature is greedy (vLLM's): logits / 1e-38 overflow


@dataclass
class SamplingParams:
    """vLLM-shaped sampling parameters (API.md lists them). A temperature 0 is greedy.

    ``best_of`` (>= n, default ``n``) sequences are generated and ``n`` returned; with
    ``use_beam_search``, ``best_of`` is the beam width and the ``n`` best are ranked as
    transformers' beam search ranks them. ``logprobs=k``: per output token its log-probability
    and rank and the ``k`` most likely tokens' (0: the chosen one only), from the model's raw
    distribution (before penalties, bias, constraints and temperature). ``min_tokens``: EOS
    and stop tokens are masked and stop strings ignored until that many tokens are out.
    ``logit_bias`` adds to a token's logit; ``logits_processors`` change a row of logits
    before sampling, called for every sequence of the request."""

    n: int = 1
    best_of: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    logprobs: int | None = None
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None
    logits_processors: list[LogitsProcessor] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is None or isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop or [])
        if self.stop_token_ids is None or isinstance(self.stop_token_ids, (list, tuple)):
            self.stop_token_ids = list(self.stop_token_ids or [])
        self.best_of = self.n if self.best_of is None else self.best_of
        self._check_types()
        self._check()

    def _check_types(self) -> None:
        """Every field of the kind it must be, and within what the engine can hold: a value
        from JSON (a batch line, an HTTP body) reaches the engine only through here."""
        for name in ("n", "best_of", "top_k", "max_tokens", "min_tokens"):
            _integer(name, getattr(self, name))
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty", "length_penalty"):
            _finite(name, getattr(self, name))
            setattr(self, name, float(getattr(self, name)))  # an int of any size -> float
        if self.seed is not None:
            _integer("seed", self.seed, SEED_MIN, SEED_MAX)
        if self.logprobs is not None:
            _integer("logprobs", self.logprobs)
        for name in ("ignore_eos", "use_beam_search"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, f"must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise _bad("stop", f"must be a string or a list of strings, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, list):
            raise _bad("stop_token_ids", f"must be a list of token ids, got "
                       f"{self.stop_token_ids!r}")
        for token in self.stop_token_ids:
            _integer("stop_token_ids", token)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise _bad("logit_bias", f"must map token ids to numbers, got "
                           f"{self.logit_bias!r}")
            for token, bias in self.logit_bias.items():
                _integer("logit_bias", token)
                _finite("logit_bias", bias)
            self.logit_bias = {token: float(bias) for token, bias in self.logit_bias.items()}
        if not isinstance(self.logits_processors, list) or not all(
                callable(p) for p in self.logits_processors):
            raise _bad("logits_processors", "must be a list of callables")

    def _check(self) -> None:
        if self.n < 1:
            raise _bad("n", f"must be at least 1, got {self.n}")
        if self.best_of < self.n:
            raise _bad("best_of", f"({self.best_of}) must be >= n ({self.n})")
        if self.temperature < 0:
            raise _bad("temperature", f"must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise _bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise _bad("top_k", f"must be -1, 0 (off) or positive, got {self.top_k}")
        for name, low, high in (("min_p", 0, 1), ("presence_penalty", -2, 2),
                                ("frequency_penalty", -2, 2)):
            if not low <= getattr(self, name) <= high:
                raise _bad(name, f"must be in [{low}, {high}], got {getattr(self, name)}")
        if self.repetition_penalty <= 0:
            raise _bad("repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        if self.max_tokens < 1:
            raise _bad("max_tokens", f"must be at least 1, got {self.max_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise _bad("logprobs", f"must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise _bad("min_tokens", f"must be in [0, max_tokens={self.max_tokens}], "
                       f"got {self.min_tokens}")
        for token, bias in (self.logit_bias or {}).items():
            if not -100 <= bias <= 100:
                raise _bad("logit_bias", f"of token {token} must be in [-100, 100], got {bias}")
        if any(t < 0 for t in self.stop_token_ids):
            raise _bad("stop_token_ids", f"must be token ids (>= 0), got {self.stop_token_ids}")
        if any(not s for s in self.stop):
            raise _bad("stop", "must not hold an empty string")
        if self.use_beam_search:
            if not self.greedy:
                raise _bad("temperature", "must be 0: beam search is deterministic (temperature=0)")
            if self.early_stopping not in (True, False, "never"):
                raise _bad("early_stopping", "must be True, False or 'never', "
                           f"got {self.early_stopping!r}")
            if (self.logprobs is not None or self.min_tokens or self.logit_bias
                    or self.logits_processors):
                raise _bad("use_beam_search", "beam search does not take logprobs, min_tokens, "
                           "logit_bias or logits processors")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def argmax_only(self) -> bool:
        """Each next token is the argmax of the raw logits and nothing else is asked of
        them: greedy, one sequence, no logprobs, penalties, bias or processors. The engine
        may then find it without the whole vocabulary's exact logits, and reports no
        cumulative_logprob (None), as vLLM does without logprobs."""
        return (self.greedy and self.best_of == 1 and not self.use_beam_search
                and self.logprobs is None and not self.logit_bias
                and not self.logits_processors and self.repetition_penalty == 1.0
                and not self.presence_penalty and not self.frequency_penalty)


def _bad(param: str, reason: str) -> RequestError:
    return RequestError(f"invalid sampling parameters: {param} {reason}", param)


def _integer(param: str, value: object, low: int = INT_MIN, high: int = INT_MAX) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(param, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise _bad(param, f"must be in [{low}, {high}], got {value}")


def _finite(param: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(param, f"must be a number, got {value!r}")
    if isinstance(value, int) and abs(value) > 1 << 1000 or not math.isfinite(value):
        raise _bad(param, f"must be a finite number, got {value}")
