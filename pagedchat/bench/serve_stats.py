"""Figures of a run against a server: TTFT, TPOT, ITL and e2e summaries, throughput, and
goodput under service-level objectives."""

from __future__ import annotations

import numpy as np

from pagedchat.bench.http_client import ServedRequest

SLO_KEYS = ("ttft", "tpot", "e2e")


def parse_slo(text: str) -> dict[str, float]:
    """``"ttft=500,tpot=50"`` (milliseconds) -> ``{"ttft": 0.5, "tpot": 0.05}`` seconds."""
    slo: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if key not in SLO_KEYS or not value:
            raise ValueError(f"cannot read SLO {item!r}: give ttft=MS, tpot=MS or e2e=MS")
        slo[key] = float(value) / 1000.0
    return slo


def summary_ms(values_s: list[float]) -> dict[str, float]:
    """mean / median / p90 / p99 in milliseconds (NaN when empty)."""
    if not values_s:
        nan = float("nan")
        return {"mean": nan, "median": nan, "p90": nan, "p99": nan}
    ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    return {"mean": float(ms.mean()), "median": float(np.median(ms)),
            "p90": float(np.percentile(ms, 90)), "p99": float(np.percentile(ms, 99))}


def meets(result: ServedRequest, slo: dict[str, float]) -> bool:
    tpot = result.tpot
    return (result.ok and result.ttft <= slo.get("ttft", float("inf"))
            and (tpot is None or tpot <= slo.get("tpot", float("inf")))
            and result.e2e <= slo.get("e2e", float("inf")))


def serve_figures(results: list[ServedRequest], duration_s: float,
                  slo: dict[str, float]) -> dict[str, object]:
    done = [r for r in results if r.ok]
    output = sum(r.output_len for r in done)
    prompt = sum(r.prompt_len for r in done)
    figures: dict[str, object] = {
        "requests": len(results), "completed": len(done), "failed": len(results) - len(done),
        "duration_s": duration_s, "prompt_tokens": prompt, "output_tokens": output,
        "requests_per_s": len(done) / duration_s,
        "output_tokens_per_s": output / duration_s,
        "total_tokens_per_s": (prompt + output) / duration_s,
        "ttft_ms": summary_ms([r.ttft for r in done]),
        "tpot_ms": summary_ms([t for t in (r.tpot for r in done) if t is not None]),
        "itl_ms": summary_ms([itl for r in done for itl in r.itls]),
        "e2e_ms": summary_ms([r.e2e for r in done]),
    }
    if slo:
        good = sum(meets(r, slo) for r in done)
        figures["slo_ms"] = {key: value * 1000.0 for key, value in slo.items()}
        figures["goodput_requests_per_s"] = good / duration_s
        figures["slo_attained"] = good / len(results) if results else float("nan")
    return figures
