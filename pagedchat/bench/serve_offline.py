"""``bench serve --compare offline``: what the HTTP server costs.

The same requests (token ids, output lengths, ignore_eos) go through the engine in this
process and through ``pagedchat serve``, started as a child process with the same engine
options. Two figures: output tokens/s with every request sent at once (the client keeps at
most ``max_concurrency`` in flight at the server; the engine takes them all, as ``bench
throughput`` does), and the time to first token of requests sent one at a time, whose
difference, request by request, is what the server adds. Each side is warmed up, then
takes the one-at-a-time requests, then the throughput trace, so that both prefix caches
see the same prompts in the same order. The engine here is freed before the server
starts: one model at a time holds the cores and the memory.
"""

from __future__ import annotations

import asyncio
import gc
from dataclasses import replace
from functools import partial
from pathlib import Path

from pagedchat.bench import report
from pagedchat.bench.engines import PagedChat
from pagedchat.bench.http_client import ServedRequest
from pagedchat.bench.load import run_load, served_model
from pagedchat.bench.serve_stats import serve_figures, summary_ms
from pagedchat.bench.servers import ServerProcess, pagedchat_command
from pagedchat.bench.sharegpt import Request
from pagedchat.bench.suite import EngineOptions, measure, sample_trace, warmup_prompt

# issue 24's targets: the server keeps this share of the engine's output tokens/s, and adds
# less than this many milliseconds to the first token of a request alone
THROUGHPUT_SHARE = 0.9
ADDED_TTFT_MS = 50.0
CONCURRENCY = 64  # the issue's: requests in flight at the server
ALONE_TOKENS = 4  # a request sent alone is timed to its first token; it need not run long
OFFLINE, SERVED = "offline engine", "pagedchat serve"


def compare_offline(options: EngineOptions, num_requests: int, alone: int, seed: int,
                    max_tokens: int | None, max_concurrency: int,
                    json_path: Path | None) -> list[dict[str, object]]:
    """Run both sides, print the comparison and the targets; returns the target rows."""
    engine = options.build()
    trace = sample_trace(engine, num_requests + alone, seed, max_tokens)
    # the first ``num_requests`` are the requests `bench throughput` samples with this seed
    requests = trace[:num_requests]
    singles = [replace(r, output_len=min(r.output_len, ALONE_TOKENS))
               for r in trace[num_requests:]]
    warmup = warmup_prompt(engine.tokenizer)
    meta = {**report.engine_metadata(engine), "max_concurrency": max_concurrency,
            "alone_requests": len(singles)}
    offline_alone, offline = _offline(engine, requests, singles, warmup)
    engine.shutdown()
    del engine
    gc.collect()
    report.note(f"starting {SERVED} with the same engine options")
    with ServerProcess(SERVED, partial(pagedchat_command, options)) as server:
        served_alone, results, duration = asyncio.run(
            _served(server.url, requests, singles, warmup, max_concurrency))
    served = serve_figures(results, duration, {})
    if served["output_tokens"] != offline["output_tokens"]:
        report.note(f"[red]the server made {served['output_tokens']} output tokens, the engine "
                    f"{offline['output_tokens']}[/red]")
    served_ttfts = [r.ttft for r in served_alone]
    rows, targets = comparison(offline, offline_alone, served, served_ttfts)
    report.emit_table("serve vs offline", rows, [
        "engine", "requests", "output_tokens", "duration_s", "output_tokens_per_s",
        "ttft_alone_ms_median", "ttft_alone_ms_mean", "ttft_added_ms_median",
        "ttft_added_ms_mean"])
    report.emit_table("targets", targets, ["target", "measured", "bound", "met"])
    report.note(f"{len(requests)} ShareGPT requests sent at once, at most {max_concurrency} in "
                f"flight at the server; {len(singles)} more sent one at a time, each timed "
                "to its first token; ttft_added = the server's time to first token minus the "
                "engine's, request by request (the client's clock against the engine's)")
    if json_path:
        alone_pairs = [{"id": r.id, "prompt_len": r.prompt_len, "offline_ttft_s": o,
                        "served_ttft_s": s}
                       for r, o, s in zip(singles, offline_alone, served_ttfts, strict=True)]
        report.write_json(json_path, meta, {OFFLINE: {**offline, **rows[0]},
                                            SERVED: {**served, **rows[1]}},
                          targets=targets, alone=alone_pairs,
                          requests=[r.record() for r in results])
    return targets


def _ignore(done: int) -> None:
    """A run's progress, not shown."""


def _offline(engine, requests: list[Request], singles: list[Request],
             warmup: list[int]) -> tuple[list[float], dict[str, object]]:
    """The engine here: each single request's time to first token, then the trace."""
    ours = PagedChat(engine)
    ours.run([Request("warmup", warmup, ALONE_TOKENS)], [0.0], _ignore)
    alone = [ours.run([r], [0.0], _ignore)[0].ttft for r in singles]
    return alone, measure(ours, requests, warmup)[0]


async def _served(url: str, requests: list[Request], singles: list[Request],
                  warmup: list[int], max_concurrency: int,
                  ) -> tuple[list[ServedRequest], list[ServedRequest], float]:
    """The server: warm-up, the single requests one at a time, then the trace at once."""
    name = await served_model(url)
    await run_load(url, name, [Request("warmup", warmup, ALONE_TOKENS)], [0.0])
    alone, _ = await run_load(url, name, singles, [0.0] * len(singles), max_concurrency=1)
    report.note(f"{SERVED}: {len(requests)} requests, at most {max_concurrency} in flight")
    results, duration = await run_load(url, name, requests, [0.0] * len(requests),
                                       max_concurrency)
    failed = [r.error for r in [*alone, *results] if not r.ok]
    if failed:
        raise ValueError(f"{len(failed)} request(s) to {SERVED} failed, first: {failed[0]}")
    return alone, results, duration


def comparison(offline: dict[str, object], offline_alone: list[float],
               served: dict[str, object], served_alone: list[float],
               ) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """One row per side and the issue's two targets. Times to first token are paired by
    request: what the server adds is the median of the per-request differences."""
    added = summary_ms([s - o for s, o in zip(served_alone, offline_alone, strict=True)])
    rows = []
    for name, figures, alone in ((OFFLINE, offline, offline_alone),
                                 (SERVED, served, served_alone)):
        ttft = summary_ms(alone)
        rows.append({"engine": name, **{key: figures[key] for key in (
            "requests", "output_tokens", "duration_s", "output_tokens_per_s")},
            "ttft_alone_ms_median": ttft["median"], "ttft_alone_ms_mean": ttft["mean"]})
    rows[1].update(ttft_added_ms_median=added["median"], ttft_added_ms_mean=added["mean"])
    share = served["output_tokens_per_s"] / offline["output_tokens_per_s"]
    targets = [
        {"target": "server/offline output tokens/s", "measured": share,
         "bound": f">= {THROUGHPUT_SHARE:g}", "met": share >= THROUGHPUT_SHARE},
        {"target": "ttft added at concurrency 1 (median ms)", "measured": added["median"],
         "bound": f"< {ADDED_TTFT_MS:g}", "met": added["median"] < ADDED_TTFT_MS},
    ]
    return rows, targets
