"""Sequence and SequenceGroup: one request's token ids, status and block table.

A request is a SequenceGroup. It starts with one Sequence (the prompt is prefilled
once); parallel samples and beams are forks of it that share its blocks."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

import torch

from pagedchat.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


_seq_ids = itertools.count()


class Sequence:
    """One stream of tokens with its own block tables, one per layer group (``kv_groups.py``).
    ``num_computed_tokens`` counts the tokens whose K/V are in the cache; the tokens after it
    (a prompt chunk, or the last sampled token) are computed next."""

    def __init__(self, token_ids: list[int], num_prompt_tokens: int, index: int = 0) -> None:
        self.seq_id = next(_seq_ids)
        self.index = index
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = num_prompt_tokens
        self.num_computed_tokens = 0
        self.block_tables: list[list[int]] = []  # empty while the sequence holds no blocks
        self.block_hashes: list[int] = []
        self.cpu_block_tables: list[list[int]] = []
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        # None once a token was chosen without its log-probability (argmax-only requests)
        self.cumulative_logprob: float | None = 0.0
        self.output_text = ""
        self.emitted_chars = 0
        self.detokenizer = None
        self.token_logprobs: list = []  # per output token, when the request asks for logprobs

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def block_table(self) -> list[int]:
        """The first group's table: the only one of a model without sliding windows."""
        return self.block_tables[0] if self.block_tables else []

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int, logprob: float | None) -> None:
        self.token_ids.append(token_id)
        if logprob is None or self.cumulative_logprob is None:
            self.cumulative_logprob = None
        else:
            self.cumulative_logprob += logprob

    def fork(self, index: int) -> Sequence:
        """A copy sharing this sequence's history; ``Scheduler.fork`` shares its blocks."""
        child = Sequence(self.token_ids, self.num_prompt_tokens, index)
        child.num_computed_tokens = self.num_computed_tokens
        child.block_hashes = list(self.block_hashes)
        child.status = self.status
        child.cumulative_logprob = self.cumulative_logprob
        child.output_text = self.output_text
        child.token_logprobs = list(self.token_logprobs)
        if self.detokenizer is not None:
            child.detokenizer = self.detokenizer.copy()
        return child


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    draft_tokens: int = 0  # speculative decoding: tokens proposed, and of them accepted
    accepted_tokens: int = 0


@dataclass
class BeamHypothesis:
    """A finished beam: its output tokens and transformers' length-penalised score."""

    token_ids: list[int]
    cumulative_logprob: float
    score: float
    finish_reason: str = "stop"


class SequenceGroup:
    """All sequences of one request, scheduled, preempted and resumed together."""

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, arrival_time: float | None = None) -> None:
        self.request_id, self.prompt = request_id, prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.seqs = [Sequence(prompt_token_ids, len(prompt_token_ids))]
        self.beam_hypotheses: list[BeamHypothesis] = []
        self.forked = params.best_of == 1 and not params.use_beam_search
        self.metrics = RequestMetrics(arrival_time or time.time())
        self.num_cached_tokens = 0
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.status = SequenceStatus.WAITING
        self.error: str | None = None  # why the request failed inside a step, if it did

    @property
    def unfinished_seqs(self) -> list[Sequence]:
        return [seq for seq in self.seqs if not seq.is_finished]

    @property
    def max_seqs(self) -> int:
        """The most sequences this group will ever run at once."""
        return self.params.best_of

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
