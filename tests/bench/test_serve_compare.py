"""`bench serve --compare offline | llama-server`: the ratios and tables from known figures,
and each comparison end to end on tiny models over loopback (no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
from typer.testing import CliRunner

from pagedchat.cli import app
from pagedchat_lab.serve_llama import (
    LLAMA,
    PAGEDCHAT,
    ratio_text,
    sustained_summary,
    sustains,
)
from pagedchat_lab.serve_offline import comparison, cost_rows, median_figures

runner = CliRunner()


def test_offline_comparison_pairs_first_tokens_by_request():
    offline = {"requests": 4, "output_tokens": 400, "duration_s": 2.0,
               "output_tokens_per_s": 200.0}
    served = {**offline, "duration_s": 2.5, "output_tokens_per_s": 160.0}
    # request 2 has a long prompt: its first token is late on both sides
    rows, cost = comparison(offline, [0.010, 0.500, 0.020], served, [0.030, 0.530, 0.030])
    assert [row["engine"] for row in rows] == ["offline engine", "pagedchat serve"]
    assert rows[1]["ttft_added_ms_median"] == pytest.approx(20.0)  # of 20, 30, 10
    assert rows[1]["ttft_added_ms_mean"] == pytest.approx(20.0)
    assert rows[0]["ttft_alone_ms_median"] == pytest.approx(20.0)
    assert "ttft_added_ms_median" not in rows[0]
    share, added = cost
    assert share["measured"] == pytest.approx(0.8) and added["measured"] == pytest.approx(20.0)
    with pytest.raises(ValueError):  # the pairs must line up
        comparison(offline, [0.01], served, [0.02, 0.03])


def figures(rate: float, ttft_p99: float, tpot_p99: float, failed: int = 0) -> dict:
    return {"request_rate": rate, "failed": failed, "ttft_ms": {"p99": ttft_p99},
            "tpot_ms": {"p99": tpot_p99}, "e2e_ms": {"p99": 1e9}}


def test_a_rate_is_sustained_when_every_p99_is_within_its_bound():
    slo = {"ttft": 2.0, "tpot": 0.1}
    assert sustains(figures(1, 2000.0, 100.0), slo)
    assert not sustains(figures(1, 2000.1, 10.0), slo)
    assert not sustains(figures(1, 10.0, 100.1), slo)
    assert not sustains(figures(1, 10.0, 10.0, failed=1), slo)
    assert not sustains(figures(1, 10.0, math.nan), slo)  # no TPOT measured is not within
    assert sustains(figures(1, 1e6, 10.0), {"tpot": 0.1})  # only what the SLO names counts


def sweep(rates_held: list[float], failed_at: float | None) -> list[dict]:
    runs = [{"request_rate": r, "sustained": True} for r in rates_held]
    if failed_at is not None:
        runs.append({"request_rate": failed_at, "sustained": False})
    return runs


def test_the_ratio_of_highest_sustained_rates():
    rates = [0.25, 0.5, 1.0, 2.0]
    summary = sustained_summary({PAGEDCHAT: sweep([0.25, 0.5, 1.0], 2.0),
                                 LLAMA: sweep([0.25], 0.5)}, rates)
    assert summary["ratio"] == pytest.approx(4.0) and not summary["ratio_is_a_bound"]
    assert ratio_text(summary) == "4.00"
    rows = {row["server"]: row for row in summary["rows"]}
    assert rows[LLAMA]["highest_sustained_rate"] == 0.25
    # pagedchat held the top rate: its limit lies above, the ratio is a lower bound
    summary = sustained_summary({PAGEDCHAT: sweep(rates, None), LLAMA: sweep([0.25], 0.5)},
                                rates)
    assert summary["ratio"] == pytest.approx(8.0) and ratio_text(summary) == ">= 8.00"
    # pagedchat held nothing: zero
    summary = sustained_summary({PAGEDCHAT: sweep([], 0.25), LLAMA: sweep([0.25], 0.5)}, rates)
    assert summary["ratio"] == 0.0 and ratio_text(summary) == "0.00"
    summary = sustained_summary({PAGEDCHAT: sweep([0.5, 1.0], None),
                                 LLAMA: sweep([0.5], 1.0)}, [0.5, 1.0])
    assert ratio_text(summary) == ">= 2.00"


def test_a_bound_when_llama_server_fails_the_lowest_rate():
    rates = [0.25, 0.5, 1.0, 2.0]
    # its limit lies below 0.25: pagedchat's 2.0 is more than 8 times it
    summary = sustained_summary({PAGEDCHAT: sweep(rates, None), LLAMA: sweep([], 0.25)}, rates)
    assert summary["ratio"] == pytest.approx(8.0) and ratio_text(summary) == ">= 8.00"
    summary = sustained_summary({PAGEDCHAT: sweep([0.25], 0.5), LLAMA: sweep([], 0.25)}, rates)
    assert ratio_text(summary) == ">= 1.00"


def test_no_ratio_when_llama_servers_limit_is_outside_the_sweep():
    rates = [0.5, 1.0]
    none = sustained_summary({PAGEDCHAT: sweep([], 0.5), LLAMA: sweep([], 0.5)}, rates)
    assert none["ratio"] is None and "add lower rates" in ratio_text(none)
    every = sustained_summary({PAGEDCHAT: sweep(rates, None), LLAMA: sweep(rates, None)}, rates)
    assert every["ratio"] is None and "add higher rates" in ratio_text(every)


def bench(*args: str):
    return runner.invoke(app, ["bench", "serve", *args])


def test_server_comparisons_run_alone(tiny_model_dir):
    tiny = ["--model", str(tiny_model_dir)]
    result = bench(*tiny, "--compare", "offline,hf-generate")
    assert result.exit_code == 2 and "compared alone" in result.output
    result = bench(*tiny, "--compare", "offline", "--base-url", "http://127.0.0.1:9")
    assert result.exit_code == 1 and "leave out --base-url" in result.output
    assert bench(*tiny, "--compare", "vllm").exit_code == 2


def lines(output: str, title: str) -> list[dict[str, str]]:
    """The ``title key=value ...`` lines a piped table prints."""
    return [dict(item.split("=", 1) for item in line.split()[1:])
            for line in output.splitlines() if line.startswith(title + " ")]


def test_compare_offline_end_to_end(tiny_model_dir, tmp_path):
    """A real `pagedchat serve` child and the engine here, on the same requests, in two
    rounds: the same output tokens, and each printed cost figure is the median of the rounds'
    ratios of the printed figures."""
    out = tmp_path / "offline.json"
    result = bench("--model", str(tiny_model_dir), "--compare", "offline", "-n", "3",
                   "--max-tokens", "3", "--alone-requests", "2", "--kv-blocks", "64",
                   "--max-concurrency", "2", "--rounds", "2", "--json", str(out))
    assert result.exit_code == 0, result.output
    rows = lines(result.stdout, "serve_vs_offline")
    assert [(row["round"], row["engine"]) for row in rows] == [
        ("0", "offline_engine"), ("0", "pagedchat_serve"),
        ("1", "offline_engine"), ("1", "pagedchat_serve")]
    assert {row["output_tokens"] for row in rows} == {"9"}
    shares = [float(served["output_tokens_per_s"]) / float(offline["output_tokens_per_s"])
              for offline, served in (rows[:2], rows[2:])]
    added = [float(rows[1]["ttft_added_ms_median"]), float(rows[3]["ttft_added_ms_median"])]
    share, added_cost = lines(result.stdout, "server_cost")
    assert float(share["measured"]) == pytest.approx(sum(shares) / 2, rel=1e-4)
    assert float(added_cost["measured"]) == pytest.approx(sum(added) / 2, rel=1e-4)
    saved = json.loads(out.read_text())
    assert saved["metadata"]["num_kv_blocks"] == 64 and saved["metadata"]["alone_requests"] == 2
    assert saved["metadata"]["rounds"] == 2 and len(saved["rounds"]) == 2
    assert set(saved["engines"]) == {"offline engine", "pagedchat serve"}
    assert [r["output_len"] for r in saved["requests"]] == [3, 3, 3]
    assert [len(one["alone"]) for one in saved["rounds"]] == [2, 2]


def test_the_cost_over_rounds_is_the_medians_of_the_rounds_figures():
    rounds = [{"figures": cost_rows(share, added)}
              for share, added in ((0.84, 30.0), (0.92, 18.0), (0.89, 20.0))]
    share, added = median_figures(rounds)
    assert share["measured"] == pytest.approx(0.89) and added["measured"] == pytest.approx(20.0)
    assert median_figures(rounds[1:2])[0]["measured"] == 0.92  # one round: its own figures


needs_llama_server = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in (
        "llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings")),
    reason="llama-cpp-python's server (the optional [peers] extra) is not installed")


@needs_llama_server
def test_compare_llama_server_end_to_end(tiny_gguf, tmp_path):
    """Both servers on the same tiny GGUF, each started afresh for its run: an SLO no run
    can meet stops both at the lowest rate, so no ratio is claimed; every request of
    both completes (pagedchat, which counts its tokens in the usage, with its full
    length: text prompts, EOS banned)."""
    out = tmp_path / "llama.json"
    result = bench("--model", str(tiny_gguf), "--compare", "llama-server", "-n", "2",
                   "--max-tokens", "4", "--rate", "inf,20", "--slo", "ttft=0.000001",
                   "--kv-blocks", "160", "--json", str(out))
    assert result.exit_code == 0, result.output
    rows = lines(result.stdout, "serve_rates")
    assert [(r["server"], r["request_rate"], r["sustained"]) for r in rows] == [
        ("pagedchat_serve", "20", "False"), ("llama-server", "20", "False")]
    saved = json.loads(out.read_text())
    for name, (run,) in saved["engines"].items():
        assert run["figures"]["completed"] == 2
        assert [r["error"] for r in run["requests"]] == [None, None]
        if name == "pagedchat serve":
            assert [r["output_len"] for r in run["requests"]] == [4, 4]
    assert saved["sustained"]["ratio"] is None
    (ratio,) = lines(result.stdout, "rate_ratio")
    assert "add_lower_rates" in ratio["measured"]
