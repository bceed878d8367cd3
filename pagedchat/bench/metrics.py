"""Latency and throughput figures, named as `vllm bench serve` names them."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

import numpy as np

MB = 1e6  # figures named *_mb are in decimal megabytes


@dataclass(slots=True)
class RequestResult:
    """What one engine did for one request; every time is in seconds on one clock."""

    prompt_len: int
    arrival: float
    token_times: list[float]  # when each output token became available
    cached_tokens: int = 0

    @property
    def output_len(self) -> int:
        return len(self.token_times)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def e2e(self) -> float:
        return self.token_times[-1] - self.arrival

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None for one-token outputs."""
        if self.output_len < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (self.output_len - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times[:-1], self.token_times[1:], strict=True)]


def summary_ms(values_s: list[float]) -> dict[str, float]:
    """mean / median / p99 in milliseconds (NaN when there is nothing to summarize)."""
    if not values_s:
        nan = float("nan")
        return {"mean": nan, "median": nan, "p99": nan}
    ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    return {"mean": float(ms.mean()), "median": float(np.median(ms)),
            "p99": float(np.percentile(ms, 99))}


def latency_figures(results: list[RequestResult]) -> dict[str, object]:
    """TTFT, TPOT, ITL and end-to-end latency summaries, and the paper's normalized latency:
    the mean over requests of end-to-end latency divided by output tokens (s/token)."""
    done = [r for r in results if r.output_len > 0]
    tpots = [t for t in (r.tpot for r in done) if t is not None]
    normalized = [r.e2e / r.output_len for r in done]
    return {
        "ttft_ms": summary_ms([r.ttft for r in done]),
        "tpot_ms": summary_ms(tpots),
        "itl_ms": summary_ms([itl for r in done for itl in r.itls]),
        "e2e_ms": summary_ms([r.e2e for r in done]),
        "normalized_latency_s_per_token": float(np.mean(normalized)) if normalized
        else float("nan"),
    }


def throughput_figures(results: list[RequestResult], duration_s: float) -> dict[str, float]:
    """Requests, output tokens and all tokens (prompt + output) per second of wall time."""
    prompt = sum(r.prompt_len for r in results)
    output = sum(r.output_len for r in results)
    return {
        "requests": len(results),
        "duration_s": duration_s,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "requests_per_s": len(results) / duration_s,
        "output_tokens_per_s": output / duration_s,
        "total_tokens_per_s": (prompt + output) / duration_s,
        "cached_tokens": sum(r.cached_tokens for r in results),  # prompt tokens not computed
    }


def resident_bytes() -> int:
    """This process's resident memory now (Linux /proc), else its peak (getrusage)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
