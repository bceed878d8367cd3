"""What every bench shares: building the engines, arrivals, one measured run."""

from __future__ import annotations

import gc
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pagedchat import console
from pagedchat.engine.config import EngineConfig
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.presets import PRESETS, swap_space
from pagedchat_lab import sharegpt
from pagedchat_lab.metrics import RequestResult, latency_figures, throughput_figures
from pagedchat_lab.peers import Peer
from pagedchat_lab.sharegpt import Request

WARMUP_TEXT = "Warm-up: say something short about paging, memory and the weather. " * 4


@dataclass
class EngineOptions:
    """The engine knobs a bench exposes (the rest are EngineConfig defaults)."""

    model: str | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: str | None = None
    max_num_seqs: int = PRESETS["bench"].max_num_seqs
    max_num_batched_tokens: int = EngineConfig.max_num_batched_tokens
    dtype: str = "float32"
    weights: str | None = None
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"
    tensor_parallel_size: int = 1
    speculative: str | None = None
    num_speculative_tokens: int = EngineConfig.num_speculative_tokens

    def with_(self, **changes) -> EngineOptions:
        return replace(self, **changes)

    def build(self) -> LLMEngine:
        """A fresh engine (so no prefix cache carries over from an earlier run)."""
        gc.collect()  # let a previous engine's KV pool go before allocating the next
        return LLMEngine(EngineConfig(
            model=self.model, block_size=self.block_size, num_kv_blocks=self.num_kv_blocks,
            kv_cache_memory=self.kv_cache_memory, max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens, dtype=self.dtype,
            weights=self.weights, kv_cache_dtype=self.kv_cache_dtype,
            enable_prefix_caching=self.enable_prefix_caching,
            preemption_mode=self.preemption_mode,
            tensor_parallel_size=self.tensor_parallel_size,
            speculative=self.speculative, num_speculative_tokens=self.num_speculative_tokens,
            swap_space=swap_space(self.preemption_mode)))


def length_limit(engine: LLMEngine) -> int:
    """The longest request (prompt + output) worth sampling: the paper's 2048, or less when
    the model's context or the whole KV pool is smaller."""
    cfg = engine.config
    return min(2048, cfg.max_model_len, cfg.num_kv_blocks * cfg.block_size)


def sample_trace(engine: LLMEngine, num_requests: int, seed: int,
                 max_tokens: int | None) -> list[Request]:
    """The paper's ShareGPT sample, within what this engine can hold."""
    return sharegpt.sample_requests(engine.tokenizer, num_requests, seed, max_tokens,
                                    max_total_len=length_limit(engine))


def parse_list(text: str, convert=str) -> list:
    """``"a,b"`` -> ``["a", "b"]`` (empty items dropped)."""
    return [convert(item.strip()) for item in text.split(",") if item.strip()]


def poisson_arrivals(count: int, rate: float, seed: int = 0) -> list[float]:
    """Arrival offsets (s) of a Poisson process at ``rate`` requests/s; inf: all at once."""
    if rate == float("inf"):
        return [0.0] * count
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.expovariate(rate)
    return offsets


def warmup_prompt(tokenizer) -> list[int]:
    return tokenizer.encode(WARMUP_TEXT, add_special_tokens=False)


def in_turn(round_index: int, ours, peers: list) -> list:
    """The order of one round of a repeated comparison: pagedchat first in even rounds,
    last in odd ones, so that a steady drift of the machine's speed cancels in the median
    of the rounds' ratios."""
    return [ours, *peers] if round_index % 2 == 0 else [*peers, ours]


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of the rounds' own ratios (round i's numerator over round i's)."""
    return statistics.median(a / b for a, b in zip(numerators, denominators, strict=True))


def measure(runner: Peer, requests: list[Request], warmup: list[int],
            arrivals: list[float] | None = None) -> tuple[dict[str, object], list[RequestResult]]:
    """Warm ``runner`` up on a prompt outside the trace (first calls pay one-off costs), then
    run the trace once under a progress bar; return its throughput and latency figures."""
    if not requests:
        raise ValueError("no request of the trace fits this engine (raise --kv-blocks or "
                         "--kv-memory, or lower --max-tokens)")
    runner.run([Request("warmup", warmup, 4)], [0.0], lambda k: None)
    arrivals = arrivals if arrivals is not None else [0.0] * len(requests)
    with console.progress(runner.label, len(requests)) as advance:
        results = runner.run(requests, arrivals, advance)
    start = min(r.arrival for r in results)
    duration = max(r.token_times[-1] for r in results) - start
    return {**throughput_figures(results, duration), **latency_figures(results)}, results
