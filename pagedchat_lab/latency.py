"""Single-stream figures: load time (first and cached), decode speed and time to first
token of a long prompt, for pagedchat and its peers (transformers ``generate``, llama.cpp)
on the same weights."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial

import torch

from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat_lab import llamacpp
from pagedchat_lab.hf import load_hf_model, weights_folder
from pagedchat_lab.suite import in_turn, median_ratio

_LOAD_PROBE = (
    "import json, sys, time\n"
    "start = time.perf_counter()\n"
    "from pagedchat.engine.config import EngineConfig\n"
    "from pagedchat.engine.llm_engine import LLMEngine\n"
    "engine = LLMEngine(EngineConfig(model=sys.argv[1] or None, num_kv_blocks=64))\n"
    "print(json.dumps({'seconds': time.perf_counter() - start,\n"
    "                  'from_cache': engine.model_files.from_cache}))\n"
)


def load_times(model: str | None) -> dict[str, float]:
    """Start-up of a fresh process (import, convert or read weights, allocate): once with
    an empty cache folder (a GGUF is de-quantized) and once more with it filled."""
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PAGEDCHAT_CACHE_DIR": cache}
        for label in ("first_load_s", "cached_load_s"):
            done = subprocess.run([sys.executable, "-c", _LOAD_PROBE, model or ""], env=env,
                                  capture_output=True, text=True, check=True)
            results[label] = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
    return results


def pagedchat_single_stream(engine: LLMEngine, prompt_ids: list[int],
                            max_tokens: int) -> dict[str, float]:
    """One request alone: time to first token and decode tokens/s after it."""
    engine.add_request("single", prompt_ids,
                       SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    final = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            final = output
    metrics = final.metrics
    decode = metrics.last_token_time - metrics.first_token_time
    return {"ttft_ms": (metrics.first_token_time - metrics.arrival_time) * 1000,
            "decode_tokens_per_s": (max_tokens - 1) / decode}


def hf_single_stream(model, prompt_ids: list[int], max_tokens: int) -> dict[str, float]:
    """transformers ``generate``, greedy, batch 1: the first token alone, then the rest."""
    ids = torch.tensor([prompt_ids])
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False)
        ttft = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens,
                       min_new_tokens=max_tokens, do_sample=False)
        total = time.perf_counter() - start
    return {"ttft_ms": ttft * 1000, "decode_tokens_per_s": (max_tokens - 1) / (total - ttft)}


SingleStream = Callable[[list[int], int], dict[str, float]]
# name -> the peer as a call (prompt ids, tokens) -> its figures, on the weights the engine
# loaded (llama.cpp: the same GGUF file, pagedchat's thread count)
SINGLE_STREAM_PEERS: dict[str, Callable[[LLMEngine], SingleStream]] = {
    "hf-generate": lambda engine: partial(hf_single_stream, load_hf_model(
        weights_folder(engine.model_files), engine.config.dtype)),
    llamacpp.NAME: lambda engine: llamacpp.LlamaCpp(llamacpp.gguf_of(engine.model_files.source)),
}


def check_single_stream_peers(names: list[str]) -> list[str]:
    unknown = [name for name in names if name not in SINGLE_STREAM_PEERS]
    if unknown:
        raise ValueError(f"unknown engine {unknown[0]!r} (choose from "
                         f"{', '.join(SINGLE_STREAM_PEERS)})")
    return names


def single_stream_peers(names: list[str], engine: LLMEngine) -> dict[str, SingleStream]:
    """The peers asked for, by name."""
    return {name: SINGLE_STREAM_PEERS[name](engine) for name in names}


def compare_single_stream(engine: LLMEngine, prompt_ids: list[int], long_prompt_ids: list[int],
                          max_tokens: int, rounds: int = 1,
                          peers: dict[str, SingleStream] | None = None,
                          ) -> dict[str, dict[str, object]]:
    """Decode speed on a short prompt and TTFT on a long one, pagedchat and each peer
    (transformers ``generate`` unless ``peers`` says otherwise), same weights.

    With ``rounds`` > 1 the engines run in turn, pagedchat first in even rounds and last
    in odd ones; each engine shows its median figures (every round's beside them) and each
    ratio is the median of the rounds' own ratios, so a drift of the machine's speed over
    the minutes of the run (its memory bandwidth is not steady) cancels."""
    if peers is None:
        peers = single_stream_peers(["hf-generate"], engine)
    pagedchat_single_stream(engine, prompt_ids, 8)  # warm every engine up once
    for run in peers.values():
        run(prompt_ids, 8)

    def ours() -> dict[str, float]:
        figures = pagedchat_single_stream(engine, prompt_ids, max_tokens)
        figures["ttft_ms"] = pagedchat_single_stream(engine, long_prompt_ids, 2)["ttft_ms"]
        engine.reset_prefix_cache()  # the next round prefills the long prompt again
        return figures

    def theirs(run: SingleStream) -> Callable[[], dict[str, float]]:
        def measured() -> dict[str, float]:
            figures = run(prompt_ids, max_tokens)
            figures["ttft_ms"] = run(long_prompt_ids, 2)["ttft_ms"]
            return figures
        return measured

    runs: dict[str, list[dict[str, float]]] = {"pagedchat": [], **{name: [] for name in peers}}
    for round_index in range(rounds):
        for name, run in in_turn(round_index, ("pagedchat", ours),
                                 [(name, theirs(peer)) for name, peer in peers.items()]):
            runs[name].append(run())

    def column(measured: list[dict[str, float]], figure: str) -> list[float]:
        return [run[figure] for run in measured]

    mine = runs["pagedchat"]
    results: dict[str, dict[str, object]] = {}
    for name, measured in runs.items():
        results[name] = {
            "decode_tokens_per_s": statistics.median(column(measured, "decode_tokens_per_s")),
            "ttft_ms": statistics.median(column(measured, "ttft_ms")),
            "decode_ratio": median_ratio(column(mine, "decode_tokens_per_s"),
                                         column(measured, "decode_tokens_per_s")),
            "ttft_ratio": median_ratio(column(measured, "ttft_ms"), column(mine, "ttft_ms")),
        }
        if rounds > 1:
            results[name]["rounds"] = measured
    return results
