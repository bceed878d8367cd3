"""Where KV cache memory goes (the paper's Fig. 2), paged vs contiguous reservation.

pagedchat is measured in its engine, from a stats snapshot after every step. The three
contiguous policies of the paper's Orca baselines are simulated in this process on the same
request trace, with the same capacity, the same ``max_num_seqs`` and the same token budget
per step; a simulated request reserves one contiguous range when admitted (first fit) and
holds it until it finishes:

- ``max-length``: the model's maximum sequence length;
- ``power-of-two``: the prompt plus the output length rounded up to a power of two
  (less than double the need);
- ``oracle``: the prompt plus exactly the true output length.

Shares are averaged over the steps where requests were waiting (memory is the limit
then). ``token_states`` holds computed K/V; ``reserved`` will be filled by this request's
later tokens; ``internal_fragmentation`` is reserved and never used (for paging: the empty
slots of allocated blocks); ``external_fragmentation`` is free memory in gaps too small for
the request at the head of the queue although enough is free in total; ``free`` is the rest
(for paging, free blocks are never fragmented: any request can use any block).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.outputs import EngineStats
from pagedchat_lab.metrics import MB, resident_bytes
from pagedchat_lab.sharegpt import Request

PARTS = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")
POLICIES = ("max-length", "power-of-two", "oracle")


def reservation(policy: str, request: Request, max_len: int) -> int:
    """Slots a contiguous policy reserves for ``request``."""
    if policy == "max-length":
        return max_len
    if policy == "power-of-two":
        return request.prompt_len + (1 << (request.output_len - 1).bit_length())
    if policy == "oracle":
        return request.prompt_len + request.output_len
    raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")


@dataclass
class Tally:
    """Shares of memory and batch sizes, summed over the sampled steps."""

    capacity: int
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    samples: int = 0
    batch_total: int = 0
    max_batch: int = 0

    def add(self, parts: dict[str, int], batch: int) -> None:
        for part, slots in parts.items():
            self.sums[part] += slots / self.capacity
        self.samples += 1
        self.batch_total += batch
        self.max_batch = max(self.max_batch, batch)

    def add_paged(self, stats: EngineStats) -> None:
        """Sample a pagedchat step (only while requests wait for memory)."""
        if stats.num_waiting + stats.num_swapped == 0:
            return
        slots = stats.total_blocks * stats.block_size
        free = slots - stats.used_blocks * stats.block_size
        self.add({"token_states": stats.live_tokens, "internal_fragmentation": stats.empty_slots,
                  "free": free}, stats.num_running)

    def figures(self) -> dict[str, float]:
        """Mean shares; ``live_of_allocated`` is the token states' share of the memory
        held for requests (token states + reserved + internal fragmentation), the figure
        the paper reports for vLLM."""
        n = max(self.samples, 1)
        shares = {part: self.sums[part] / n for part in PARTS}
        held = shares["token_states"] + shares["reserved"] + shares["internal_fragmentation"]
        return {**shares, "live_of_allocated": shares["token_states"] / held if held else 0.0,
                "mean_batch_size": self.batch_total / n, "max_batch_size": self.max_batch,
                "sampled_steps": self.samples}


@dataclass
class _Held:
    start: int
    size: int
    request: Request
    computed: int  # tokens whose K/V is stored
    generated: int

    @property
    def final(self) -> int:
        return self.request.prompt_len + self.request.output_len


def _first_fit(held: list[_Held], size: int, capacity: int) -> tuple[int | None, int]:
    """Start of the first gap of ``size`` slots (or None) and the largest gap."""
    ranges = sorted((h.start, h.size) for h in held) + [(capacity, 0)]
    cursor, largest, found = 0, 0, None
    for start, length in ranges:
        gap = start - cursor
        largest = max(largest, gap)
        if found is None and gap >= size:
            found = cursor
        cursor = start + length
    return found, largest


def simulate_contiguous(requests: list[Request], policy: str, capacity: int, max_len: int,
                        max_num_seqs: int, max_batched_tokens: int) -> dict[str, float]:
    """Run the trace (all arrived at once) through iteration-level scheduling with contiguous
    reservation; return the shares of memory and the batch sizes reached."""
    too_big = [r for r in requests if reservation(policy, r, max_len) > capacity]
    if too_big:
        raise ValueError(f"{policy}: a request needs {reservation(policy, too_big[0], max_len)} "
                         f"slots but the budget is {capacity}; give the bench more KV blocks")
    tally = Tally(capacity)
    waiting = deque(requests)
    running: list[_Held] = []
    while waiting or running:
        for h in running:  # decode one token each
            h.computed += 1
            h.generated += 1
        running = [h for h in running if h.generated < h.request.output_len]
        budget = max_batched_tokens - len(running)
        while waiting and len(running) < max_num_seqs:
            r = waiting[0]
            size = reservation(policy, r, max_len)
            start, _ = _first_fit(running, size, capacity)
            if start is None or (r.prompt_len > budget and running):
                break
            running.append(_Held(start, size, waiting.popleft(), r.prompt_len, 1))
            budget -= r.prompt_len
        if waiting:
            tally.add(_contiguous_parts(running, waiting[0], policy, capacity, max_len),
                      len(running))
    return tally.figures()


def _contiguous_parts(running: list[_Held], head: Request, policy: str, capacity: int,
                      max_len: int) -> dict[str, int]:
    free = capacity - sum(h.size for h in running)
    _, largest = _first_fit(running, 0, capacity)
    stranded = free >= reservation(policy, head, max_len) > largest
    return {
        "token_states": sum(h.computed for h in running),
        "reserved": sum(h.final - h.computed for h in running),
        "internal_fragmentation": sum(h.size - h.final for h in running),
        "external_fragmentation": free if stranded else 0,
        "free": 0 if stranded else free,
    }


def resident_figures(engine: LLMEngine) -> dict[str, float]:
    """The process's resident memory against what it must hold: the weights and the KV
    pool's blocks ever written (a CPU pool's pages come in as its blocks are first written).
    ``beyond_weights_and_kv_mb`` is the rest: Python, torch, the tokenizer, activations and
    the buffers kept for reuse."""
    runner, blocks = engine.runner, engine.scheduler.block_manager
    written, rss = blocks.high_water * runner.block_bytes, resident_bytes()
    return {"rss_mb": rss / MB, "weights_mb": runner.weight_bytes / MB,
            "kv_written_mb": written / MB,
            "kv_pool_mb": blocks.num_blocks * runner.block_bytes / MB,
            "beyond_weights_and_kv_mb": (rss - runner.weight_bytes - written) / MB}
