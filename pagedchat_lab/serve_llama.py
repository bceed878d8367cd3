"""``bench serve --compare llama-server``: the request rate ``pagedchat serve`` sustains
against llama-cpp-python's server, on the same GGUF file with the same number of threads.

Both servers get the same Poisson trace at each rate, lowest first, until a rate is not
sustained: every request completed and the p99 of each objective in the SLO (TTFT, TPOT,
e2e) within its bound. Each run starts a fresh server (so no prompt is cached from an
earlier rate), the two servers in turn at each rate (so a drift of the machine's speed
touches both). A TPOT bound alone cannot tell a server that keeps up from one
whose queue grows: llama-cpp-python serves one request at a time, so its TPOT stays
flat at any rate while waiting requests pile up in its TTFT; so the SLO bounds both.
Prompts go as text (llama-cpp-python takes no token ids) and EOS is banned through
``logit_bias``, which both servers honour, so that every output has its trace length.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch

from pagedchat import console
from pagedchat_lab import llamacpp, report, sharegpt
from pagedchat_lab.load import run_load, served_model
from pagedchat_lab.remote import model_tokenizer, run_at_rate
from pagedchat_lab.servers import ServerProcess, llama_server_command, pagedchat_command
from pagedchat_lab.suite import WARMUP_TEXT, EngineOptions, warmup_prompt

PAGEDCHAT, LLAMA = "pagedchat serve", "llama-server"
CONTEXT = 2048  # the longest request (prompt + output) of the trace
LLAMA_CONTEXT = CONTEXT + 256  # room for a text that llama.cpp splits into a few more tokens


def compare_llama_server(options: EngineOptions, num_requests: int, rates: list[float],
                         burstiness: float, seed: int, max_tokens: int | None,
                         slo: dict[str, float], max_concurrency: int | None,
                         json_path: Path | None) -> dict[str, object]:
    """Sweep both servers; print each run, the highest sustained rates and their ratio."""
    if not slo:
        raise ValueError("--compare llama-server needs an SLO, e.g. --slo ttft=2000,tpot=100")
    files, tokenizer = model_tokenizer(options.model)
    gguf = llamacpp.gguf_of(files.source)
    requests = sharegpt.sample_requests(tokenizer, num_requests, seed, max_tokens,
                                        max_total_len=CONTEXT)
    texts = [tokenizer.decode(r.prompt_ids) for r in requests]
    extra = {"logit_bias": {str(tokenizer.eos_token_id): -100}}
    warmup = sharegpt.Request("warmup", warmup_prompt(tokenizer), 4)
    threads = torch.get_num_threads()  # what the pagedchat server will take
    servers = {
        PAGEDCHAT: partial(pagedchat_command, options),
        LLAMA: partial(llama_server_command, gguf, threads, LLAMA_CONTEXT),
    }
    sweeps: dict[str, list[dict[str, object]]] = {name: [] for name in servers}
    rows = []
    for rate in sorted(rates):
        for server_name, command in servers.items():
            runs = sweeps[server_name]
            if runs and not runs[-1]["figures"]["sustained"]:
                continue  # it stopped at a lower rate
            console.note(f"{server_name}: {len(requests)} requests at {rate:g} req/s")
            with ServerProcess(server_name, command) as server:
                name = asyncio.run(served_model(server.url))
                asyncio.run(run_load(server.url, name, [warmup], [0.0], texts=[WARMUP_TEXT],
                                     extra=extra))
                run = run_at_rate(server.url, name, requests, rate, burstiness, seed, slo,
                                  max_concurrency, texts=texts, extra=extra)
            run["figures"]["sustained"] = sustains(run["figures"], slo)
            runs.append(run)
            rows.append({"server": server_name, **report.flatten(run["figures"])})
    report.emit_table("serve rates", rows, [
        "server", "request_rate", "completed", "requests_per_s", "output_tokens_per_s",
        "ttft_ms_median", "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p99", "sustained"])
    summary = sustained_summary({name: [run["figures"] for run in runs]
                                 for name, runs in sweeps.items()}, sorted(rates))
    report.emit_table("sustained rate", summary["rows"], [
        "server", "highest_sustained_rate", "above_the_sweep"])
    report.emit_table("rate ratio", [{"figure": "pagedchat/llama-server sustained rate",
                                      "measured": ratio_text(summary)}], ["figure", "measured"])
    bounds = ", ".join(f"{key} {value * 1000:g} ms" for key, value in slo.items())
    console.note(f"sustained: every request completed, p99 within {bounds}; {len(requests)} "
                 f"ShareGPT requests per rate, gamma arrivals of shape {burstiness:g}; "
                 f"{threads} threads for each server; each stops at its first rate not "
                 "sustained")
    if json_path:
        meta = {"gguf": str(gguf), "threads": threads, "num_requests": len(requests),
                "seed": seed, "burstiness": burstiness,
                "slo_ms": {key: value * 1000 for key, value in slo.items()},
                "engine_options": asdict(options)}
        report.write_json(json_path, meta, sweeps, sustained=summary)
    return summary


def sustains(figures: dict[str, object], slo: dict[str, float]) -> bool:
    """Every request completed and the p99 of each SLO key within its bound (a NaN p99,
    nothing measured, is not within)."""
    return figures["failed"] == 0 and all(
        figures[f"{key}_ms"]["p99"] <= bound * 1000.0 for key, bound in slo.items())


def sustained_summary(sweeps: dict[str, list[dict[str, object]]],
                      rates: list[float]) -> dict[str, object]:
    """The highest sustained rate of each server (None: not even the lowest), whether it
    sustained every rate of the sweep (then its true limit lies higher), and the ratio of
    pagedchat's to llama-server's: a lower bound when pagedchat held the top rate or
    llama-server not even the lowest; None when neither held any rate or both held all."""
    rows = []
    for name, runs in sweeps.items():
        held = [f["request_rate"] for f in runs if f["sustained"]]
        rows.append({"server": name, "highest_sustained_rate": max(held) if held else None,
                     "above_the_sweep": bool(held) and max(held) == max(rates)})
    found = {row["server"]: row for row in rows}
    ours, theirs = found[PAGEDCHAT], found[LLAMA]
    ratio, is_a_bound = None, ours["above_the_sweep"]
    if theirs["highest_sustained_rate"] and not theirs["above_the_sweep"]:
        ratio = (ours["highest_sustained_rate"] or 0.0) / theirs["highest_sustained_rate"]
    elif theirs["highest_sustained_rate"] is None and ours["highest_sustained_rate"]:
        # llama-server failed the lowest rate, so its limit lies below it
        ratio, is_a_bound = ours["highest_sustained_rate"] / min(rates), True
    return {"rows": rows, "ratio": ratio, "ratio_is_a_bound": is_a_bound}


def ratio_text(summary: dict[str, object]) -> str:
    """The ratio as the note prints it, or why there is none."""
    ratio = summary["ratio"]
    if ratio is None:
        theirs = next(row for row in summary["rows"] if row["server"] == LLAMA)
        where = "higher" if theirs["above_the_sweep"] else "lower"
        return f"unknown (llama-server's limit lies outside the sweep: add {where} rates)"
    return (">= " if summary["ratio_is_a_bound"] else "") + f"{ratio:.2f}"
