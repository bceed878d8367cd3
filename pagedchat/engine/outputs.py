"""What the engine hands back: per request, the state of each of its sequences; and
EngineStats, the one snapshot of its memory and counters that chat, bench and inspect read."""

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
    cumulative_logprob: float | None  # None for argmax-only requests (SamplingParams)
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
    # why the request failed inside a step (its outputs end with finish_reason "error")
    error: str | None = None


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
    """One sequence's table in one layer group (one group unless the model has sliding-window
    layers); ``blocks`` leaves out the entries whose blocks slid out of the window."""

    request_id: str
    seq_index: int
    blocks: list[BlockEntry]
    layer_group: int = 0
    window: int | None = None  # the group's sliding window, None for global layers
    slid_out: int = 0  # leading entries given back to the pool by the window


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
    window_freed_blocks: int = 0  # blocks given back to the pool as they slid out of a window
    kv_cache_dtype: str = "float32"  # the K/V pool's element type in force (int8: kv_int8.py)
    # per layer group its sliding window, None for global layers (one None: no windows)
    group_windows: list[int | None] = field(default_factory=lambda: [None])
    # speculative decoding in force (None: off), and its tokens proposed and accepted
    speculative: str | None = None
    draft_tokens: int = 0
    accepted_tokens: int = 0
    # the KV store (kv_store.py): blocks read back from disk and written to it; None: none
    kv_store_read: int | None = None
    kv_store_written: int = 0
    block_tables: list[SeqBlockTable] = field(default_factory=list)
    groups: list[GroupSharing] = field(default_factory=list)
    pool: list[str] = field(default_factory=list)  # per block: free | cached | used | shared
    owners: dict[int, list[str]] = field(default_factory=dict)

    def speculation(self) -> str:
        """Which speculative decoding is in force and how its drafts fared, in a few words."""
        if self.speculative is None:
            return "off"
        rate = self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0
        return (f"{self.speculative}, {self.accepted_tokens} of {self.draft_tokens} proposed "
                f"tokens accepted ({rate:.0%})")

    @property
    def has_windows(self) -> bool:
        """Whether the model has sliding-window layers (local layer groups)."""
        return any(window is not None for window in self.group_windows)

    def held_by_kind(self) -> tuple[int, int]:
        """Distinct blocks the running sequences hold in global and in local layer groups."""
        held: tuple[set[int], set[int]] = (set(), set())
        for table in self.block_tables:
            held[table.window is not None].update(entry.physical for entry in table.blocks)
        return len(held[0]), len(held[1])
