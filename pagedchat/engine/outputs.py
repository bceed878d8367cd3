"""What the engine hands back: per request, the state of each of its sequences; and
EngineStats, the one snapshot of its memory and counters that chat, bench and inspect read."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedchat.engine.sequence import RequestMetrics


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float
    finish_reason: str | None = None
    delta: str = ""

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


@dataclass
class BlockEntry:
    logical: int
    physical: int
    filled: int
    ref_count: int
    cached: bool  # full and findable by its prefix hash
    shared: bool  # held by more than one block table


@dataclass
class SeqBlockTable:
    request_id: str
    seq_index: int
    blocks: list[BlockEntry]


@dataclass
class GroupSharing:
    """For a request with several sequences: what sharing spares it."""

    request_id: str
    num_seqs: int
    blocks_without_sharing: int
    blocks_held: int


@dataclass
class EngineStats:
    total_blocks: int
    block_size: int
    used_blocks: int
    free_blocks: int
    cached_blocks: int
    live_tokens: int
    empty_slots: int
    utilization: float
    internal_fragmentation: float
    shared_blocks: int
    saved_blocks: int
    prefix_queries: int
    prefix_hits: int
    prefix_hit_rate: float
    preemptions: int
    swapped_out: int
    swapped_in: int
    host_blocks_used: int
    num_running: int
    num_waiting: int
    num_swapped: int
    block_tables: list[SeqBlockTable] = field(default_factory=list)
    groups: list[GroupSharing] = field(default_factory=list)
    pool: list[str] = field(default_factory=list)  # per block: free | cached | used | shared
    owners: dict[int, list[str]] = field(default_factory=dict)
