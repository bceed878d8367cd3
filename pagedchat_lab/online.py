"""Online serving: the same requests at each request rate, pagedchat and its peers."""

from __future__ import annotations

from pathlib import Path

from pagedchat_lab import report
from pagedchat_lab.engines import PagedChat
from pagedchat_lab.peers import PeerSettings, make_peers
from pagedchat_lab.suite import EngineOptions, measure, poisson_arrivals, warmup_prompt


def serve_rates(title: str, options: EngineOptions, make_requests, rates: list[float],
                compare: list[str], batch_sizes: list[int], hf_page_size: int, seed: int,
                plot: Path, json_path: Path | None) -> None:
    """Each rate's Poisson arrivals through a fresh pagedchat and every peer: a table, a
    plot of normalized latency against rate, and the figures as JSON when asked."""
    engine = options.build()
    requests = make_requests(engine)
    warmup = warmup_prompt(engine.tokenizer)
    peers = make_peers(compare, PeerSettings(engine, batch_sizes, hf_page_size))
    engines: dict[str, list[dict[str, object]]] = {}
    rows = []
    for index, rate in enumerate(rates):
        arrivals = poisson_arrivals(len(requests), rate, seed)
        if index:  # a fresh prefix cache for every rate; the last engine's pool goes first
            engine = None
            engine = options.build()
        for runner in [PagedChat(engine), *peers]:
            runner.reset()
            figures = {"request_rate": rate, **measure(runner, requests, warmup, arrivals)[0]}
            alone = sum(peer.name == runner.name for peer in peers) <= 1
            engines.setdefault(runner.name if alone else runner.label, []).append(figures)
            rows.append({"engine": runner.label, **report.flatten(figures)})
        del runner  # PagedChat's, when there are no peers, holds the engine
    report.emit_table(title, rows, [
        "engine", "request_rate", "requests_per_s", "ttft_ms_mean", "ttft_ms_p99",
        "tpot_ms_mean", "itl_ms_p99", "e2e_ms_mean", "normalized_latency_s_per_token"])
    report.plot_lines(plot, {name: [(f["request_rate"], f["normalized_latency_s_per_token"])
                                    for f in runs] for name, runs in engines.items()},
                      "request rate (req/s)", "normalized latency (s/token)",
                      f"{title}: {len(requests)} requests")
    report.save(json_path, engine, engines)
