"""`pagedchat bench serve`: online serving on ShareGPT at each request rate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagedchat.cli.options import user_errors
from pagedchat_lab.cli import options as opt

DEFAULT_SLO = "ttft=2000,tpot=100"  # what --compare llama-server's sustained rate keeps
CONCURRENCY = 64  # requests in flight at the server with --compare offline

BaseUrl = Annotated[str | None, typer.Option(
    "--base-url", help="Benchmark this OpenAI-compatible server instead of an engine built "
                       "here, e.g. http://127.0.0.1:8000 (pagedchat serve, llama-server, "
                       "vllm serve).")]
MaxConcurrency = Annotated[int | None, typer.Option(
    "--max-concurrency", min=1, help="With --base-url or a server comparison: most requests "
                                     "in flight at once.")]
Burstiness = Annotated[float, typer.Option(
    "--burstiness", min=0.01, help="With --base-url or --compare llama-server: shape of the "
                                   "gamma arrival gaps; 1 is Poisson, lower is burstier.")]
Slo = Annotated[str, typer.Option(
    "--slo", help="Milliseconds, e.g. ttft=500,tpot=50 (e2e= too). With --base-url: goodput "
                  "counts the requests within them; with --compare llama-server: the p99s a "
                  f"sustained rate keeps within them (default there: {DEFAULT_SLO}).")]
ApiKey = Annotated[str | None, typer.Option(
    "--api-key", envvar="OPENAI_API_KEY", help="With --base-url: sent as a bearer token.")]
# server comparisons, each run alone: `pagedchat serve` against the engine in this process,
# or against llama-cpp-python's server; the requests each one samples unless -n says
SERVER_COMPARISONS = {"offline": 64, "llama-server": 32}
TRACE_REQUESTS = 200


def _check_compare(value: str) -> str:
    from pagedchat_lab.peers import parse_peers
    from pagedchat_lab.suite import parse_list
    names = parse_list(value)
    if any(name in SERVER_COMPARISONS for name in names):
        if len(names) > 1:
            raise typer.BadParameter("offline and llama-server are compared alone")
        return value
    try:
        parse_peers(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    return value


ServeCompare = Annotated[str, typer.Option(
    "--compare", callback=_check_compare,
    help="Peers run in this process (hf-generate, hf-continuous, llama.cpp, pagedchat-DTYPE), "
         "or one server comparison: offline (pagedchat serve, a child process with these "
         "engine options, against the engine here on the same requests: output tokens/s "
         f"with all sent at once, --max-concurrency in flight (default: {CONCURRENCY}), and "
         "the time to first token of --alone-requests sent one at a time) or llama-server "
         "(pagedchat "
         "serve against llama-cpp-python's server on the same GGUF and threads: each takes "
         "--rate, lowest first, until the p99s miss --slo; the highest rate each sustains).")]
ServeRequests = Annotated[int | None, typer.Option(
    "-n", "--num-requests", min=1,
    help=f"Requests sampled from the trace (default: {TRACE_REQUESTS}; "
         + ", ".join(f"{n} with --compare {name}" for name, n in SERVER_COMPARISONS.items())
         + ").")]
AloneRequests = Annotated[int, typer.Option(
    "--alone-requests", min=1,
    help="With --compare offline: requests sent one at a time, timed to the first token.")]
Rounds = Annotated[int, typer.Option(
    "--rounds", min=1,
    help="With --compare offline: run both sides this many times, in turn (the engine first "
         "in even rounds); each figure is the median of the rounds'.")]


def serve(num_requests: ServeRequests = None, model: opt.Model = None,
          max_tokens: opt.MaxTokens = None, rate: opt.Rates = "0.5,1,2", compare: ServeCompare = "",
          hf_batch_size: opt.HfBatch = "8",
          hf_page_size: opt.HfPage = 256, seed: opt.Seed = 0, block_size: opt.BlockSize = 16,
          kv_blocks: opt.KvBlocks = None, kv_memory: opt.KvMemory = None,
          max_num_seqs: opt.MaxSeqs = opt.MAX_SEQS, dtype: opt.DTypeOption = opt.DType.float32,
          weights: opt.Weights = None, plot: opt.Plot = Path("bench-serve.png"),
          json_path: opt.JsonPath = None,
          tp: opt.TensorParallelSize = 1, base_url: BaseUrl = None,
          max_concurrency: MaxConcurrency = None, burstiness: Burstiness = 1.0, slo: Slo = "",
          api_key: ApiKey = None, alone_requests: AloneRequests = 8,
          rounds: Rounds = 1) -> None:
    """Online serving: Poisson arrivals; TTFT, TPOT, ITL, e2e and normalized latency."""
    from pagedchat_lab.online import serve_rates
    from pagedchat_lab.remote import bench_remote
    from pagedchat_lab.serve_llama import compare_llama_server
    from pagedchat_lab.serve_offline import compare_offline
    from pagedchat_lab.serve_stats import parse_slo
    from pagedchat_lab.suite import parse_list, sample_trace
    with user_errors():
        names, rates = parse_list(compare), parse_list(rate, float)
        options = opt.engine_options(model, dtype, block_size, kv_blocks, kv_memory,
                                     max_num_seqs, tp, weights=weights)
        if names and names[0] in SERVER_COMPARISONS:
            if base_url:
                raise ValueError(f"--compare {names[0]} starts its own servers: leave out "
                                 "--base-url")
            count = num_requests or SERVER_COMPARISONS[names[0]]
            if names[0] == "offline":
                compare_offline(options, count, alone_requests, seed, max_tokens,
                                max_concurrency or CONCURRENCY, json_path, rounds)
            else:
                compare_llama_server(options, count, rates, burstiness, seed, max_tokens,
                                     parse_slo(slo or DEFAULT_SLO), max_concurrency, json_path)
            return
        num_requests = num_requests or TRACE_REQUESTS
        if base_url:
            bench_remote(base_url, model, num_requests, rates, seed, max_tokens,
                         max_concurrency, burstiness, parse_slo(slo), api_key, json_path)
            return
        serve_rates("serve", options,
                    lambda engine: sample_trace(engine, num_requests, seed, max_tokens),
                    rates, names, parse_list(hf_batch_size, int), hf_page_size, seed, plot,
                    json_path)
