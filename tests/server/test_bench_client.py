"""`bench serve --base-url`: arrivals, the HTTP client against a live server, the figures."""

from __future__ import annotations

import json
import statistics

import pytest
from typer.testing import CliRunner

from pagedchat_lab import sharegpt
from pagedchat_lab.load import arrival_offsets, run_load
from pagedchat_lab.metrics import RequestResult
from pagedchat_lab.serve_stats import parse_slo, serve_figures


def gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in zip(offsets, offsets[1:])]


def test_arrivals_keep_the_rate_and_burstiness_widens_the_gaps():
    poisson = gaps(arrival_offsets(4000, rate=4.0, burstiness=1.0, seed=1))
    bursty = gaps(arrival_offsets(4000, rate=4.0, burstiness=0.25, seed=1))
    assert statistics.mean(poisson) == pytest.approx(0.25, rel=0.08)
    assert statistics.mean(bursty) == pytest.approx(0.25, rel=0.15)
    # gamma gaps: coefficient of variation 1/sqrt(shape): 1 for Poisson, 2 at 0.25
    assert statistics.stdev(poisson) / statistics.mean(poisson) == pytest.approx(1.0, rel=0.1)
    assert statistics.stdev(bursty) / statistics.mean(bursty) == pytest.approx(2.0, rel=0.2)
    assert arrival_offsets(3, float("inf")) == [0.0, 0.0, 0.0]


def test_figures_and_goodput_from_known_requests():
    fast = RequestResult(10, 0.0, [0.1, 0.2, 0.3], id="a", expected_output_len=3, counted_len=3)
    slow = RequestResult(10, 0.0, [1.0, 1.5, 2.0], id="b", expected_output_len=3, counted_len=3)
    failed = RequestResult(10, 0.0, id="c", expected_output_len=3, error="HTTP 500")
    figures = serve_figures([fast, slow, failed], 2.0, parse_slo("ttft=500,tpot=200"))
    assert figures["completed"] == 2 and figures["failed"] == 1
    assert figures["ttft_ms"]["mean"] == pytest.approx(550.0)
    assert figures["tpot_ms"]["median"] == pytest.approx(300.0)
    assert figures["itl_ms"]["p90"] <= 500.0
    assert figures["goodput_requests_per_s"] == pytest.approx(0.5)  # only "a" meets it
    assert figures["slo_attained"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="cannot read SLO"):
        parse_slo("latency=3")


def trace(tokenizer, count: int) -> list[sharegpt.Request]:
    ids = tokenizer.encode("Tell me about paged attention.")
    return [sharegpt.Request(f"r{i}", ids, 6 + i) for i in range(count)]


async def test_run_load_against_a_live_server(live_server):
    requests = trace(live_server.state.tokenizer, 4)
    results, duration = await run_load(live_server.url, "tiny", requests, [0.0] * 4,
                                       max_concurrency=2)
    assert duration > 0
    assert [r.output_len for r in results] == [6, 7, 8, 9]
    assert all(r.ok and r.ttft > 0 and len(r.token_times) <= r.output_len for r in results)


async def test_run_load_sends_texts_and_extra_fields(live_server):
    """A server that takes no token ids gets the text; extra fields go into every body."""
    no_ids = [sharegpt.Request(f"t{i}", [], 6) for i in range(2)]
    results, _ = await run_load(live_server.url, "tiny", no_ids, [0.0, 0.0],
                                texts=["Tell me about paged attention."] * 2,
                                extra={"max_tokens": 2})
    assert [(r.error, r.output_len) for r in results] == [(None, 2), (None, 2)]
    results, _ = await run_load(live_server.url, "tiny", no_ids[:1], [0.0])
    assert results[0].error.startswith("HTTP 400")  # the empty ids themselves are refused


def test_bench_serve_base_url_writes_per_request_json(live_server, tiny_model_dir, tmp_path,
                                                      monkeypatch):
    from pagedchat.cli import app

    monkeypatch.setattr(sharegpt, "sample_requests",
                        lambda tokenizer, n, *args, **kwargs: trace(tokenizer, n))
    out = tmp_path / "serve.json"
    result = CliRunner().invoke(app, [
        "bench", "serve", "--base-url", f"{live_server.url}/v1", "--model", str(tiny_model_dir),
        "-n", "3", "--rate", "inf", "--max-concurrency", "2", "--slo", "ttft=60000",
        "--json", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())
    (run,) = saved["engines"]["tiny"]
    assert run["figures"]["completed"] == 3 and run["figures"]["slo_attained"] == 1.0
    assert [r["output_len"] for r in run["requests"]] == [6, 7, 8]
