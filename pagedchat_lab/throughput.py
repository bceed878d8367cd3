"""Offline throughput: pagedchat and its peers on the same requests, run in rounds, each
engine's median run kept, and the matmul ceiling the run is measured against."""

from __future__ import annotations

from pagedchat import console
from pagedchat_lab import report
from pagedchat_lab.ceiling import load_config, measure_ceiling, work_flops
from pagedchat_lab.engines import PagedChat
from pagedchat_lab.peers import Peer
from pagedchat_lab.sharegpt import Request
from pagedchat_lab.suite import in_turn, measure, median_ratio

Figures = dict[str, object]


def run_rounds(ours: PagedChat, peers: list[Peer], requests: list[Request], warmup: list[int],
               rounds: int, first: Figures) -> dict[str, list[Figures]]:
    """Every engine's runs by label. ``first`` is pagedchat's run made before any peer was
    loaded; a peer that fails is named with its error and removed from ``peers``. Later
    rounds take the engines in turn, pagedchat first in even rounds and last in odd ones,
    so that a steady drift of the machine's speed cancels in the ratios."""
    runs = {ours.label: [first]}
    for round_index in range(rounds):
        for runner in list(peers) if round_index == 0 else in_turn(round_index, ours, peers):
            runner.reset()
            try:
                runs.setdefault(runner.label, []).append(measure(runner, requests, warmup)[0])
            except Exception as error:  # a peer's own limits end its runs, not the command
                if runner is ours:
                    raise
                console.note(f"[red]{runner.label} could not run: {type(error).__name__}: "
                             f"{error}[/red]; it is left out")
                peers.remove(runner)
                runs.pop(runner.label, None)
    return runs


def summarize(runs: dict[str, list[Figures]], ours: PagedChat, peers: list[Peer],
              extras: Figures) -> tuple[dict[str, Figures], list[Figures]]:
    """The figures per engine name (a peer's best setting) and one table row per run label,
    each with pagedchat's ratio: the median of the rounds' ratios."""
    figures = {"pagedchat": {**median_run(runs[ours.label]), **extras}}
    rows = [{"engine": ours.label, **figures["pagedchat"], "pagedchat_ratio": 1.0}]
    for peer in peers:
        result = median_run(runs[peer.label])
        rows.append({"engine": peer.label, **result, "pagedchat_ratio": median_ratio(
            [run["output_tokens_per_s"] for run in runs[ours.label]],
            [run["output_tokens_per_s"] for run in runs[peer.label]])})
        best = figures.get(peer.name)
        if best is None or result["output_tokens_per_s"] > best["output_tokens_per_s"]:
            figures[peer.name] = {**result, **peer.setting,
                                  "pagedchat_ratio": rows[-1]["pagedchat_ratio"]}
    return figures, rows


def median_run(results: list[Figures]) -> Figures:
    """The run of median output tokens/s (the lower middle one of an even count), with
    every run's figure beside it."""
    ranked = sorted(results, key=lambda result: result["output_tokens_per_s"])
    median = dict(ranked[(len(ranked) - 1) // 2])
    if len(results) > 1:
        median["rounds_output_tokens_per_s"] = [r["output_tokens_per_s"] for r in results]
    return median


def step_profile(engine) -> dict[str, float]:
    """Seconds per step in each phase; ``forward`` holds the matrix work and attention,
    the other phases are the overhead around them."""
    timer = engine.runner.timer
    steps = max(timer.steps, 1)
    per_step = {f"{name}_ms": seconds * 1000 / steps for name, seconds in timer.seconds.items()}
    shares = timer.shares()
    report.emit_table("step profile", [{"phase": name, "ms_per_step": per_step[f"{name}_ms"],
                                        "share": shares[name]} for name in timer.seconds],
                      ["phase", "ms_per_step", "share"])
    return {**per_step, "overhead_share": 1 - shares.get("forward", 0.0) - shares.get(
        "logits", 0.0)}


def ceiling_shares(engine, ours: Figures) -> Figures:
    """The ceiling, and two shares of it: output tokens/s against the ceiling's tokens/s
    (prompt tokens count for nothing there), and the matrix FLOP/s of every token the run
    processed, prompts included, against the ceiling's FLOP/s (the usual model FLOP share)."""
    config = load_config(engine.model_files.folder)
    found = measure_ceiling(config, batch=engine.config.max_num_seqs)
    achieved = work_flops(config, ours["prompt_tokens"], ours["output_tokens"]) / ours[
        "duration_s"] / 1e9
    rows = []
    for name in ("float32", "bfloat16"):
        found[name]["output_share"] = ours["output_tokens_per_s"] / found[name]["tokens_per_s"]
        found[name]["flop_share"] = achieved / found[name]["gflop_per_s"]
        rows.append({"dtype": name, **found[name]})
    found["pagedchat_gflop_per_s"] = achieved
    report.emit_table("ceiling", rows, ["dtype", "product", "gflop_per_s", "tokens_per_s",
                                        "output_share", "flop_share"])
    console.note(f"matmul ceiling: one step of batch {found['batch']} with every layer's own "
                 f"weights, the faster of torch's F.linear and the CPU kernels' product (oneDNN "
                 f"on packed weights), {found['gflop_per_token']:.3f} GFLOP/token; pagedchat (in "
                 f"{engine.config.dtype}) did {achieved:.1f} GFLOP/s of matrix work, prompts "
                 "included; output_share = its output tokens/s / the ceiling's tokens/s")
    return found

