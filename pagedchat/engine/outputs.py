"""What the engine hands back: per request, the state of each of its sequences."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedchat.engine.sequence import RequestMetrics


@dataclass
class Logprob:
    """A token's log-probability and its rank (1: the most likely) at one position."""

    logprob: float
    rank: int


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float
    finish_reason: str | None = None
    delta: str = ""
    # per output token, with SamplingParams.logprobs: the chosen token first, then the top k
    logprobs: list[dict[int, Logprob]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    beam_scores: list[float] = field(default_factory=list)
