"""``pagedchat bench serve --base-url URL``: the serve benchmark against any
OpenAI-compatible server (pagedchat serve, llama-server, vllm serve).

The trace is sampled from ShareGPT with the tokenizer of ``--model`` (the server's model
should share it: prompts are sent as token ids, with the trace's output length and
ignore_eos, as `vllm bench serve` sends them).
"""

from __future__ import annotations

import asyncio
import platform
from pathlib import Path

from pagedchat import console
from pagedchat.engine.loading.loader import prepare_model, reads_quantized
from pagedchat.engine.loading.tokenizer import load_tokenizer
from pagedchat.engine.model_config import ModelConfig
from pagedchat_lab import report, sharegpt
from pagedchat_lab.load import arrival_offsets, run_load, served_model
from pagedchat_lab.serve_stats import serve_figures
from pagedchat_lab.sharegpt import Request


def model_tokenizer(model: str | None):
    """The model's files and its tokenizer, without building an engine (nor converting a
    GGUF the quantized path reads as it is)."""
    files = prepare_model(model, "gguf" if reads_quantized(model) else "float32")
    return files, load_tokenizer(ModelConfig.from_folder(files.folder))


def bench_remote(base_url: str, model: str | None, num_requests: int, rates: list[float],
                 seed: int, max_tokens: int | None, max_concurrency: int | None,
                 burstiness: float, slo: dict[str, float], api_key: str | None,
                 json_path: Path | None) -> list[dict[str, object]]:
    """Run the trace at each rate; print one row per rate; write figures and every
    request's record to ``json_path``."""
    files, tokenizer = model_tokenizer(model)
    requests = sharegpt.sample_requests(tokenizer, num_requests, seed, max_tokens)
    base_url = base_url.rstrip("/").removesuffix("/v1")
    name = asyncio.run(served_model(base_url, api_key))
    runs = [run_at_rate(base_url, name, requests, rate, burstiness, seed, slo, max_concurrency,
                        api_key) for rate in rates]
    rows = [report.flatten(run["figures"]) for run in runs]
    columns = ["request_rate", "completed", "requests_per_s", "output_tokens_per_s",
               "ttft_ms_mean", "ttft_ms_median", "ttft_ms_p99", "tpot_ms_mean", "tpot_ms_p99",
               "itl_ms_p99", "e2e_ms_mean"]
    if slo:
        columns += ["goodput_requests_per_s", "slo_attained"]
    report.emit_table(f"serve {base_url} ({name})", rows, columns)
    if json_path:
        meta = {"base_url": base_url, "served_model": name, "tokenizer": files.source,
                "num_requests": len(requests), "seed": seed,
                "client_machine": platform.processor() or platform.machine()}
        report.write_json(json_path, meta, {name: runs})
    return rows


def run_at_rate(base_url: str, name: str, requests: list[Request], rate: float,
                burstiness: float, seed: int, slo: dict[str, float],
                max_concurrency: int | None = None, api_key: str | None = None,
                texts: list[str] | None = None, extra: dict | None = None,
                ) -> dict[str, object]:
    """The trace sent at one rate (``run_load`` says how): its figures, and every request's
    record; failed requests are counted in the figures and the first is shown."""
    offsets = arrival_offsets(len(requests), rate, burstiness, seed)
    results, duration = asyncio.run(run_load(base_url, name, requests, offsets,
                                             max_concurrency, api_key, texts, extra))
    figures = {"request_rate": rate, "burstiness": burstiness,
               "max_concurrency": max_concurrency, **serve_figures(results, duration, slo)}
    failures = [r.error for r in results if r.error]
    if failures:
        console.note(f"[red]{len(failures)} request(s) failed[/red], first: {failures[0]}")
    return {"figures": figures, "requests": [r.record() for r in results]}
