"""Latency and throughput figures, named as `vllm bench serve` names them."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field

import numpy as np

MB = 1e6  # figures named *_mb are in decimal megabytes


@dataclass(slots=True)
class RequestResult:
    """What one engine or server did for one request; every time is in seconds on one clock
    (a server's: the client's, its times those of the text chunks it streamed)."""

    prompt_len: int
    arrival: float
    token_times: list[float] = field(default_factory=list)  # when each output token came
    cached_tokens: int = 0
    id: str = ""
    expected_output_len: int = 0  # what was asked for
    counted_len: int = 0  # a server's own count of its output tokens (its usage), if any
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.token_times)

    @property
    def output_len(self) -> int:
        return self.counted_len or len(self.token_times)

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

    def record(self) -> dict[str, object]:
        """A served request as the JSON of a run against a server keeps it."""
        return {"id": self.id, "prompt_len": self.prompt_len,
                "expected_output_len": self.expected_output_len, "sent": self.arrival,
                "chunk_times": self.token_times, "output_len": self.output_len,
                "error": self.error, "ttft_s": self.ttft if self.ok else None,
                "e2e_s": self.e2e if self.ok else None, "tpot_s": self.tpot if self.ok else None}


def summary_ms(values_s: list[float], percentiles: tuple[int, ...] = (99,)) -> dict[str, float]:
    """mean, median and each percentile (``p99``, ...) in milliseconds (NaN when there is
    nothing to summarize)."""
    if not values_s:
        return dict.fromkeys(["mean", "median", *(f"p{p}" for p in percentiles)], float("nan"))
    ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    return {"mean": float(ms.mean()), "median": float(np.median(ms)),
            **{f"p{p}": float(np.percentile(ms, p)) for p in percentiles}}


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
