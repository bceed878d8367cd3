"""The engines pagedchat is measured against: one protocol, and a table that makes each by
name on what pagedchat's engine loaded (the same weights and KV memory)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from pagedchat.engine.config import DTYPE_NAMES
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat_lab import llamacpp, vllm_cpu
from pagedchat_lab.engines import PagedChat
from pagedchat_lab.hf import HFContinuous, HFGenerate, load_hf_model, weights_folder
from pagedchat_lab.metrics import RequestResult
from pagedchat_lab.sharegpt import Request

# transformers' continuous batching does best with at most 64 requests and 2048 tokens per
# batch on ShareGPT; it keeps that budget (pagedchat's own is smaller, to hold less
# activation memory)
HF_MAX_REQUESTS = (64,)
HF_MAX_BATCH_TOKENS = 2048


class Peer(Protocol):
    """An engine a request trace is run through."""

    name: str  # the engine, as the JSON names it
    label: str  # this setting of it, as a table row names it
    setting: dict[str, object]  # what sets it apart from the engine's other peers

    def reset(self) -> None:
        """Start the next run cold: nothing cached from the runs before."""

    def run(self, requests: list[Request], arrivals: list[float],
            advance: Callable[[int], None]) -> list[RequestResult]:
        """Serve ``requests`` arriving at ``arrivals`` (seconds from now, ascending)."""


@dataclass
class PeerSettings:
    """What the peers are made on: pagedchat's engine, and each peer's settings (each static
    batch size, continuous request limit and llama.cpp sequence count a peer of its own)."""

    engine: LLMEngine
    hf_batch_sizes: Sequence[int] = (8,)
    hf_page_size: int = 256
    hf_max_requests: Sequence[int] = HF_MAX_REQUESTS
    llamacpp_seqs: Sequence[int] = llamacpp.SEQUENCES
    vllm_python: str | None = None

    @functools.cached_property
    def hf_model(self):
        """The transformers model of the engine's weights, loaded once for every HF peer."""
        return load_hf_model(weights_folder(self.engine.model_files), self.engine.config.dtype)


def _hf_generate(s: PeerSettings) -> list[Peer]:
    tokenizer = s.engine.tokenizer
    pad = tokenizer.eos_token_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    return [HFGenerate(s.hf_model, pad, size) for size in s.hf_batch_sizes]


def _hf_continuous(s: PeerSettings) -> list[Peer]:
    # the pool's bytes as tokens of every layer's K/V (a page holds one group's layers)
    cfg, runner = s.engine.config, s.engine.runner
    kv_tokens = cfg.num_kv_blocks * cfg.block_size // runner.kv_groups.num_groups
    return [HFContinuous(s.hf_model, kv_tokens, HF_MAX_BATCH_TOKENS, limit, s.hf_page_size)
            for limit in s.hf_max_requests]


def _vllm_cpu(s: PeerSettings) -> list[Peer]:
    """vLLM with pagedchat's batch limit and KV bytes, under ``vllm_python``."""
    if not s.vllm_python:
        raise ValueError("the vllm-cpu peer runs in vLLM's own virtualenv: pass "
                         "--vllm-python PATH (or set PAGEDCHAT_VLLM_PYTHON)")
    cfg = s.engine.config
    return [vllm_cpu.VllmCpu(s.vllm_python, weights_folder(s.engine.model_files), cfg.dtype,
                             cfg.num_kv_blocks * s.engine.runner.block_bytes, cfg.max_num_seqs)]


def _pagedchat_in(dtype: str) -> Callable[[PeerSettings], list[Peer]]:
    """pagedchat with the same settings, KV pool included (in blocks), in another dtype."""
    return lambda s: [PagedChat(LLMEngine(replace(s.engine.config, dtype=dtype)),
                                name=f"pagedchat-{dtype}")]


PEERS: dict[str, Callable[[PeerSettings], list[Peer]]] = {
    "hf-generate": _hf_generate,
    "hf-continuous": _hf_continuous,
    llamacpp.NAME: lambda s: llamacpp.batched_peers(s.engine, s.llamacpp_seqs),
    vllm_cpu.NAME: _vllm_cpu,
    **{f"pagedchat-{dtype}": _pagedchat_in(dtype) for dtype in DTYPE_NAMES},
}


def parse_peers(text: str) -> list[str]:
    """``"a,b"`` -> the peer names, each checked against :data:`PEERS`."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PEERS]
    if unknown:
        raise ValueError(f"unknown engine {unknown[0]!r} (choose from {', '.join(PEERS)})")
    return names


def make_peers(names: list[str], settings: PeerSettings) -> list[Peer]:
    """The peers asked for, in order."""
    return [peer for name in names for peer in PEERS[name](settings)]
