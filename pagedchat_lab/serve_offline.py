"""``bench serve --compare offline``: what the HTTP server costs.

The same requests (token ids, output lengths, ignore_eos) go through the engine in this
process and through ``pagedchat serve``, started as a child process with the same engine
options. Two figures: output tokens/s with every request sent at once (the client keeps at
most ``max_concurrency`` in flight at the server; the engine takes them all, as ``bench
throughput`` does), and the time to first token of requests sent one at a time, whose
difference, request by request, is what the server adds. Each side is warmed up, then
takes the one-at-a-time requests, then the throughput trace, so that both prefix caches
see the same prompts in the same order. The engine here is freed before the server
starts: one model at a time holds the cores and the memory. With several rounds the two
sides take turns and each figure is the median of the rounds' figures: on a shared machine
one side's speed alone moves by several percent from one run to the next.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
from dataclasses import replace
from functools import partial
from pathlib import Path

from pagedchat import console
from pagedchat_lab import report
from pagedchat_lab.engines import PagedChat
from pagedchat_lab.load import run_load, served_model
from pagedchat_lab.metrics import RequestResult, summary_ms
from pagedchat_lab.serve_stats import serve_figures
from pagedchat_lab.servers import ServerProcess, pagedchat_command
from pagedchat_lab.sharegpt import Request
from pagedchat_lab.suite import (
    EngineOptions,
    in_turn,
    measure,
    sample_trace,
    warmup_prompt,
)

ALONE_TOKENS = 4  # a request sent alone is timed to its first token; it need not run long
OFFLINE, SERVED = "offline engine", "pagedchat serve"


def compare_offline(options: EngineOptions, num_requests: int, alone: int, seed: int,
                    max_tokens: int | None, max_concurrency: int,
                    json_path: Path | None, rounds: int = 1) -> list[dict[str, object]]:
    """Run both sides ``rounds`` times, in turn (the engine first in even rounds), print
    the comparison and what the server costs; returns those figures' rows. Each is the median of
    the rounds' own figures, so that a drift of the machine's speed cancels out."""
    engine = options.build()
    trace = sample_trace(engine, num_requests + alone, seed, max_tokens)
    # the first ``num_requests`` are the requests `bench throughput` samples with this seed
    requests = trace[:num_requests]
    singles = [replace(r, output_len=min(r.output_len, ALONE_TOKENS))
               for r in trace[num_requests:]]
    warmup = warmup_prompt(engine.tokenizer)
    meta = {**console.engine_metadata(engine), "max_concurrency": max_concurrency,
            "alone_requests": len(singles), "rounds": rounds}
    measured = []
    for round_index in range(rounds):
        sides = {}
        for side in in_turn(round_index, OFFLINE, [SERVED]):
            if side == OFFLINE:
                if engine is None:
                    engine = options.build()
                sides[OFFLINE] = _offline(engine, requests, singles, warmup)
                engine.shutdown()
                engine = None
                gc.collect()  # one model at a time holds the cores and the memory
            else:
                sides[SERVED] = _served_process(options, requests, singles, warmup,
                                                max_concurrency)
        measured.append(_round(round_index, singles, *sides[OFFLINE], *sides[SERVED]))
    rows, figures = [row for one in measured for row in one["rows"]], median_figures(measured)
    report.emit_table("serve vs offline", rows, [
        "round", "engine", "requests", "output_tokens", "duration_s", "output_tokens_per_s",
        "ttft_alone_ms_median", "ttft_alone_ms_mean", "ttft_added_ms_median",
        "ttft_added_ms_mean"])
    report.emit_table("server cost", figures, ["figure", "measured"])
    console.note(f"{len(requests)} ShareGPT requests sent at once, at most {max_concurrency} in "
                 f"flight at the server; {len(singles)} more sent one at a time, each timed "
                 "to its first token; ttft_added = the server's time to first token minus the "
                 "engine's, request by request (the client's clock against the engine's)"
                 + (f"; server cost: medians of {rounds} rounds' figures, the sides in turn"
                   if rounds > 1 else ""))
    if json_path:
        shares = [one["figures"][0]["measured"] for one in measured]
        median_round = measured[_median_index(shares)]
        every_round = [{key: one[key] for key in ("rows", "figures", "alone")}
                       for one in measured]
        report.write_json(json_path, meta, median_round["engines"], figures=figures,
                          alone=median_round["alone"], rounds=every_round,
                          requests=[r.record() for r in median_round["results"]])
    return figures


def _served_process(options: EngineOptions, requests: list[Request], singles: list[Request],
                    warmup: list[int], max_concurrency: int,
                    ) -> tuple[list[float], dict[str, object], list[RequestResult]]:
    """``pagedchat serve`` as a child process with the engine options: each single
    request's time to first token, the trace's figures and its per-request results."""
    console.note(f"starting {SERVED} with the same engine options")
    with ServerProcess(SERVED, partial(pagedchat_command, options),
                       ready_path="/health") as server:
        served_alone, results, duration = asyncio.run(
            _served(server.url, requests, singles, warmup, max_concurrency))
    return [r.ttft for r in served_alone], serve_figures(results, duration, {}), results


def _round(round_index: int, singles: list[Request], offline_alone: list[float],
           offline: dict[str, object], served_alone: list[float], served: dict[str, object],
           results: list[RequestResult]) -> dict[str, object]:
    """One round's rows, server cost and per-request pairs."""
    if served["output_tokens"] != offline["output_tokens"]:
        console.note(f"[red]round {round_index}: the server made {served['output_tokens']} "
                     f"output tokens, the engine {offline['output_tokens']}[/red]")
    rows, figures = comparison(offline, offline_alone, served, served_alone)
    for row in rows:
        row["round"] = round_index
    return {"rows": rows, "figures": figures, "results": results,
            "engines": {OFFLINE: {**offline, **rows[0]}, SERVED: {**served, **rows[1]}},
            "alone": [{"id": r.id, "prompt_len": r.prompt_len, "offline_ttft_s": o,
                       "served_ttft_s": s}
                      for r, o, s in zip(singles, offline_alone, served_alone, strict=True)]}


def median_figures(measured: list[dict[str, object]]) -> list[dict[str, object]]:
    """The server's cost over the rounds: the median of the rounds' throughput shares and of
    their median added times to first token (one round: that round's own)."""
    share, added = (statistics.median(one["figures"][i]["measured"] for one in measured)
                    for i in range(2))
    return cost_rows(share, added)


def _median_index(values: list[float]) -> int:
    """The index of the value nearest the median (the median itself for an odd count)."""
    middle = statistics.median(values)
    return min(range(len(values)), key=lambda i: abs(values[i] - middle))


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
                  ) -> tuple[list[RequestResult], list[RequestResult], float]:
    """The server: warm-up, the single requests one at a time, then the trace at once."""
    name = await served_model(url)
    await run_load(url, name, [Request("warmup", warmup, ALONE_TOKENS)], [0.0])
    alone, _ = await run_load(url, name, singles, [0.0] * len(singles), max_concurrency=1)
    console.note(f"{SERVED}: {len(requests)} requests, at most {max_concurrency} in flight")
    results, duration = await run_load(url, name, requests, [0.0] * len(requests),
                                       max_concurrency)
    failed = [r.error for r in [*alone, *results] if not r.ok]
    if failed:
        raise ValueError(f"{len(failed)} request(s) to {SERVED} failed, first: {failed[0]}")
    return alone, results, duration


def comparison(offline: dict[str, object], offline_alone: list[float],
               served: dict[str, object], served_alone: list[float],
               ) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """One row per side and what the server costs. Times to first token are paired by
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
    return rows, cost_rows(share, added["median"])


def cost_rows(share: float, added_ms: float) -> list[dict[str, object]]:
    """What the server costs: its share of the engine's output tokens/s, and what it adds to
    the first token of a request alone."""
    return [{"figure": "server/offline output tokens/s", "measured": share},
            {"figure": "ttft added at concurrency 1 (median ms)", "measured": added_ms}]
