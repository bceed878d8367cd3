"""Latency and throughput arithmetic."""

from __future__ import annotations

import math

import pytest

from pagedchat_lab.metrics import (
    RequestResult,
    latency_figures,
    summary_ms,
    throughput_figures,
)


def test_request_result_times():
    r = RequestResult(prompt_len=5, arrival=10.0, token_times=[10.5, 10.7, 11.0, 11.5])
    assert r.output_len == 4
    assert r.ttft == pytest.approx(0.5)
    assert r.e2e == pytest.approx(1.5)
    assert r.tpot == pytest.approx((11.5 - 10.5) / 3)
    assert r.itls == pytest.approx([0.2, 0.3, 0.5])
    assert RequestResult(1, 0.0, [2.0]).tpot is None


def test_summary_in_milliseconds():
    s = summary_ms([0.001 * v for v in range(1, 101)])
    assert s["mean"] == pytest.approx(50.5)
    assert s["median"] == pytest.approx(50.5)
    assert s["p99"] == pytest.approx(99.01)
    assert all(math.isnan(v) for v in summary_ms([]).values())


def test_normalized_latency_is_mean_of_e2e_per_token():
    a = RequestResult(1, 0.0, [1.0, 2.0])        # e2e 2 s, 2 tokens -> 1 s/token
    b = RequestResult(1, 0.0, [1.0, 2.0, 3.0, 4.0])  # e2e 4 s, 4 tokens -> 1 s/token
    c = RequestResult(1, 1.0, [2.0, 4.0, 7.0])   # e2e 6 s, 3 tokens -> 2 s/token
    figures = latency_figures([a, b, c])
    assert figures["normalized_latency_s_per_token"] == pytest.approx(4 / 3)
    assert figures["e2e_ms"]["mean"] == pytest.approx(4000)
    assert figures["ttft_ms"]["median"] == pytest.approx(1000)
    assert figures["itl_ms"]["mean"] == pytest.approx(1000 * (1 + 1 + 1 + 1 + 2 + 3) / 6)


def test_throughput_counts_prompt_and_output():
    results = [RequestResult(10, 0.0, [1.0] * 5), RequestResult(20, 0.0, [2.0] * 15)]
    t = throughput_figures(results, duration_s=4.0)
    assert t["requests_per_s"] == 0.5
    assert t["output_tokens_per_s"] == 5.0
    assert t["total_tokens_per_s"] == 12.5
