"""Figures of a run against a server: TTFT, TPOT, ITL and e2e summaries, throughput, and
goodput under service-level objectives."""

from __future__ import annotations

from pagedchat_lab.metrics import RequestResult, summary_ms

SLO_KEYS = ("ttft", "tpot", "e2e")
SERVE_PERCENTILES = (90, 99)  # `vllm bench serve`'s


def parse_slo(text: str) -> dict[str, float]:
    """``"ttft=500,tpot=50"`` (milliseconds) -> ``{"ttft": 0.5, "tpot": 0.05}`` seconds."""
    slo: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if key not in SLO_KEYS or not value:
            raise ValueError(f"cannot read SLO {item!r}: give ttft=MS, tpot=MS or e2e=MS")
        slo[key] = float(value) / 1000.0
    return slo


def meets(result: RequestResult, slo: dict[str, float]) -> bool:
    tpot = result.tpot
    return (result.ok and result.ttft <= slo.get("ttft", float("inf"))
            and (tpot is None or tpot <= slo.get("tpot", float("inf")))
            and result.e2e <= slo.get("e2e", float("inf")))


def serve_figures(results: list[RequestResult], duration_s: float,
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
        "ttft_ms": summary_ms([r.ttft for r in done], SERVE_PERCENTILES),
        "tpot_ms": summary_ms([t for t in (r.tpot for r in done) if t is not None],
                              SERVE_PERCENTILES),
        "itl_ms": summary_ms([itl for r in done for itl in r.itls], SERVE_PERCENTILES),
        "e2e_ms": summary_ms([r.e2e for r in done], SERVE_PERCENTILES),
    }
    if slo:
        good = sum(meets(r, slo) for r in done)
        figures["slo_ms"] = {key: value * 1000.0 for key, value in slo.items()}
        figures["goodput_requests_per_s"] = good / duration_s
        figures["slo_attained"] = good / len(results) if results else float("nan")
    return figures
