"""The options `bench serve` takes for a run against a server (``--base-url``), kept here
so that the command itself only names them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

BaseUrl = Annotated[str | None, typer.Option(
    "--base-url", help="Benchmark this OpenAI-compatible server instead of an engine built "
                       "here, e.g. http://127.0.0.1:8000 (pagedchat serve, llama-server, "
                       "vllm serve).")]
MaxConcurrency = Annotated[int | None, typer.Option(
    "--max-concurrency", min=1, help="With --base-url: most requests in flight at once.")]
Burstiness = Annotated[float, typer.Option(
    "--burstiness", min=0.01, help="With --base-url: shape of the gamma arrival gaps; 1 is "
                                   "Poisson, lower is burstier.")]
Slo = Annotated[str, typer.Option(
    "--slo", help="With --base-url: goodput counts requests within these milliseconds, e.g. "
                  "ttft=500,tpot=50 (e2e= too).")]
ApiKey = Annotated[str | None, typer.Option(
    "--api-key", envvar="OPENAI_API_KEY", help="With --base-url: sent as a bearer token.")]


def run(base_url: str, model: str | None, num_requests: int, rates: list[float], seed: int,
        max_tokens: int | None, max_concurrency: int | None, burstiness: float, slo: str,
        api_key: str | None, json_path: Path | None) -> None:
    from pagedchat.bench.remote import bench_remote
    from pagedchat.bench.serve_stats import parse_slo

    bench_remote(base_url, model, num_requests, rates, seed, max_tokens, max_concurrency,
                 burstiness, parse_slo(slo), api_key, json_path)
