"""`pagedchat bench serve`: online serving on ShareGPT at each request rate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagedchat.bench.online import serve_rates
from pagedchat.bench.suite import (
    parse_list,
    parse_peers,
    sample_trace,
)
from pagedchat.cli.bench.options import (
    MAX_SEQS,
    Compare,
    DType,
    Dtype,
    HfBatch,
    HfPage,
    MaxSeqs,
    MaxTokens,
    NumRequests,
    Plot,
    Rates,
    Seed,
    engine_options,
)
from pagedchat.cli.options import (
    BlockSize,
    JsonPath,
    KvBlocks,
    KvMemory,
    Model,
    TensorParallelSize,
    Weights,
    user_errors,
)

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


def serve(num_requests: NumRequests = 200, model: Model = None, max_tokens: MaxTokens = None,
          rate: Rates = "0.5,1,2", compare: Compare = "", hf_batch_size: HfBatch = "8",
          hf_page_size: HfPage = 256, seed: Seed = 0, block_size: BlockSize = 16,
          kv_blocks: KvBlocks = None, kv_memory: KvMemory = None, max_num_seqs: MaxSeqs = MAX_SEQS,
          dtype: Dtype = DType.float32,
          weights: Weights = None, plot: Plot = Path("bench-serve.png"),
          json_path: JsonPath = None,
          tp: TensorParallelSize = 1, base_url: BaseUrl = None,
          max_concurrency: MaxConcurrency = None, burstiness: Burstiness = 1.0, slo: Slo = "",
          api_key: ApiKey = None) -> None:
    """Online serving: Poisson arrivals; TTFT, TPOT, ITL, e2e and normalized latency."""
    with user_errors():
        if base_url:
            from pagedchat.bench.remote import bench_remote
            from pagedchat.bench.serve_stats import parse_slo

            bench_remote(base_url, model, num_requests, parse_list(rate, float), seed,
                         max_tokens, max_concurrency, burstiness, parse_slo(slo), api_key,
                         json_path)
            return
        options = engine_options(model, dtype, block_size, kv_blocks, kv_memory, max_num_seqs, tp,
                                 weights=weights)
        serve_rates("serve", options,
               lambda engine: sample_trace(engine, num_requests, seed, max_tokens),
               parse_list(rate, float), parse_peers(compare), parse_list(hf_batch_size, int),
               hf_page_size, seed, plot, json_path)
