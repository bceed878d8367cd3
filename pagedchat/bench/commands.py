"""``pagedchat bench ...``, ``pagedchat batch`` and ``pagedchat inspect``: thin Typer shells.

Each bench builds pagedchat (and the peers asked for) on the same weights, samples its
workload from the ShareGPT trace, runs it, prints a table (``key=value`` lines when piped)
and, with ``--json``, writes the figures with the run's metadata.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from pagedchat.bench import report, sharegpt
from pagedchat.bench.ceiling import load_config, measure_ceiling, work_flops
from pagedchat.bench.engines import PagedChat
from pagedchat.bench.memory import (
    PARTS,
    POLICIES,
    Tally,
    resident_figures,
    simulate_contiguous,
)
from pagedchat.bench.suite import (
    EngineOptions,
    in_turn,
    length_limit,
    make_peers,
    measure,
    median_ratio,
    parse_list,
    parse_peers,
    poisson_arrivals,
    sample_trace,
    warmup_prompt,
)
from pagedchat.engine.config import EngineConfig
from pagedchat.engine.errors import PagedChatError

bench_app = typer.Typer(help="The paper's evaluation on this machine, peers side by side.",
                        no_args_is_help=True)


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


def _check_peers(value: str) -> str:
    try:
        parse_peers(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    return value


def _check_numbers(value: str) -> str:
    try:
        numbers = parse_list(value, float)
    except ValueError as error:
        raise typer.BadParameter(f"not a list of numbers: {value!r}") from error
    if not numbers or min(numbers) <= 0:
        raise typer.BadParameter("give one or more positive numbers, e.g. 0.5,1,2 (inf: all "
                                 "at once)")
    return value


def _check_sizes(value: str) -> str:
    try:
        sizes = parse_list(value, int)
    except ValueError as error:
        raise typer.BadParameter(f"not a list of whole numbers: {value!r}") from error
    if not sizes or min(sizes) < 1:
        raise typer.BadParameter("give one or more positive whole numbers, e.g. 8,16,32")
    return value


NumRequests = Annotated[int, typer.Option("-n", "--num-requests", min=1,
                                          help="Requests sampled from the trace.")]
Model = Annotated[str | None, typer.Option(
    "--model", help="HF folder or GGUF file (default: SmolLM2-135M-Instruct).")]
MaxTokens = Annotated[int | None, typer.Option("--max-tokens", min=1,
                                               help="Cap every output length.")]
JsonPath = Annotated[Path | None, typer.Option("--json", help="Write figures + metadata.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the request sample and arrivals.")]
BlockSize = Annotated[int, typer.Option("--block-size", help="Tokens per KV block.")]
KvBlocks = Annotated[int | None, typer.Option("--kv-blocks", min=1,
                                              help="KV pool size in blocks.")]
KvMemory = Annotated[str | None, typer.Option("--kv-memory",
                                              help="KV pool size in bytes, e.g. 1GiB.")]
MAX_SEQS = EngineConfig.max_num_seqs
MaxSeqs = Annotated[int, typer.Option("--max-num-seqs", min=1, help="Most sequences per step.")]
Dtype = Annotated[DType, typer.Option("--dtype", help="Weights and KV cache dtype.")]
Compare = Annotated[str, typer.Option(
    "--compare", callback=_check_peers,
    help="Peers to run too: hf-generate,hf-continuous, llama.cpp (batched, on the same GGUF; "
         "needs the [peers] extra), or pagedchat-DTYPE (pagedchat in another dtype, e.g. "
         "pagedchat-float32).")]
HfBatch = Annotated[str, typer.Option(
    "--hf-batch-size", callback=_check_sizes,
    help="Static batch sizes for hf-generate (the best is kept).")]
HfRequests = Annotated[str, typer.Option(
    "--hf-max-requests", callback=_check_sizes,
    help="Requests per batch for hf-continuous (the best is kept).")]
HfPage = Annotated[int, typer.Option("--hf-page-size", min=4,
                                     help="hf-continuous page size in tokens.")]
Rates = Annotated[str, typer.Option("--rate", callback=_check_numbers,
                                    help="Request rates (req/s), e.g. 0.5,1,2; inf = all at once.")]
Plot = Annotated[Path, typer.Option("--plot", help="Where to write the PNG.")]
TensorParallelSize = Annotated[int, typer.Option(
    "--tensor-parallel-size", "-tp", min=1,
    help="Workers that split the model's heads (one process each).")]


@contextmanager
def _user_errors() -> Iterator[None]:
    """A problem the user can fix becomes one line on stderr and exit code 1."""
    try:
        yield
    except (PagedChatError, ValueError, OSError) as error:
        # OSError covers a missing file as well as a full disk while writing results.
        report.note(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from error


def _options(model, dtype, block_size=16, kv_blocks=None, kv_memory=None,
             max_num_seqs=MAX_SEQS, tp=1) -> EngineOptions:
    return EngineOptions(model=model, block_size=block_size, num_kv_blocks=kv_blocks,
                         kv_cache_memory=kv_memory, max_num_seqs=max_num_seqs,
                         dtype=DType(dtype).value, tensor_parallel_size=tp)


def _meta(engine) -> dict[str, object]:
    return report.run_metadata(engine.config, engine.model_files.source)


def _flat(figures: dict[str, object]) -> dict[str, object]:
    """``{"ttft_ms": {"mean": 1}}`` -> ``{"ttft_ms_mean": 1}`` for tables."""
    flat: dict[str, object] = {}
    for key, value in figures.items():
        if isinstance(value, dict):
            flat.update({f"{key}_{sub}": v for sub, v in value.items()})
        else:
            flat[key] = value
    return flat


# ---- throughput -------------------------------------------------------------------------------
@bench_app.command()
def throughput(num_requests: NumRequests = 200, model: Model = None,
               max_tokens: MaxTokens = None, compare: Compare = "", hf_batch_size: HfBatch = "8",
               hf_max_requests: HfRequests = "64", hf_page_size: HfPage = 256,
               llamacpp_seqs: Annotated[str, typer.Option(
                   "--llamacpp-seqs", callback=_check_sizes,
                   help="Sequences per llama.cpp context (the best is kept).")] = "16,64,256",
               seed: Seed = 0, block_size: BlockSize = 16,
               kv_blocks: KvBlocks = None, kv_memory: KvMemory = None,
               max_num_seqs: MaxSeqs = MAX_SEQS, dtype: Dtype = DType.float32,
               ceiling: Annotated[bool, typer.Option(help="Measure the matmul ceiling.")] = True,
               profile: Annotated[bool, typer.Option(
                   help="Print where pagedchat's steps spent their time.")] = False,
               json_path: JsonPath = None,
               tp: TensorParallelSize = 1,
               rounds: Annotated[int, typer.Option(
                   "--rounds", min=1,
                   help="Run pagedchat and its peers this many times, in turn, pagedchat "
                        "first in even rounds and last in odd ones; each engine's median run "
                        "is shown, each ratio is the median of the rounds' ratios (a steady "
                        "drift of the machine's speed cancels).")] = 1,
               ) -> None:
    """Offline throughput on ShareGPT (ignore_eos, output = reference length)."""
    with _user_errors():
        batch_sizes = parse_list(hf_batch_size, int)
        engine = _options(model, dtype, block_size, kv_blocks, kv_memory, max_num_seqs,
                          tp).build()
        requests = sample_trace(engine, num_requests, seed, max_tokens)
        warmup = warmup_prompt(engine.tokenizer)
        engine.runner.timer.reset()
        ours = PagedChat(engine)
        runs = {ours.label: [measure(ours, requests, warmup)[0]]}
        # what only pagedchat's first run gives, kept beside its median run
        extras = {"memory": (resident := resident_figures(engine))}
        report.note(f"pagedchat resident memory {resident['rss_mb']:.0f} MB: weights "
                    f"{resident['weights_mb']:.0f} + KV pool {resident['kv_pool_mb']:.0f} (of "
                    f"which {resident['kv_written_mb']:.0f} ever used) + "
                    f"{resident['beyond_weights_and_kv_mb']:.0f} MB beyond them")
        if profile:
            extras["step_profile"] = _step_profile(engine)
        if tp > 1:
            from pagedchat.bench.parallel import communication_figures

            extras["communication"] = comm = communication_figures(engine)
            report.note(f"tensor parallel x{tp}: {comm['all_reduce_bytes_per_token']:.0f} bytes "
                        f"all-reduced per token, {comm['broadcast_bytes_per_step']:.0f} bytes "
                        f"broadcast per step; {comm['weights_per_worker_mb']:.0f} MB of weights "
                        "per worker")
        peers = make_peers(parse_peers(compare), engine, batch_sizes, hf_page_size,
                           parse_list(hf_max_requests, int), parse_list(llamacpp_seqs, int))
        for round_index in range(rounds):
            # in round 0 ours ran already, first, before any peer was loaded
            for runner in peers if round_index == 0 else in_turn(round_index, ours, peers):
                if isinstance(runner, PagedChat):
                    runner.reset()
                runs.setdefault(runner.label, []).append(
                    measure(runner, requests, warmup)[0])
        figures = {"pagedchat": {**_median_run(runs[ours.label]), **extras}}
        rows = [{"engine": ours.label, **figures["pagedchat"], "pagedchat_ratio": 1.0}]
        for peer in peers:
            result = _median_run(runs[peer.label])
            rows.append({"engine": peer.label, **result, "pagedchat_ratio": median_ratio(
                [run["output_tokens_per_s"] for run in runs[ours.label]],
                [run["output_tokens_per_s"] for run in runs[peer.label]])})
            best = figures.get(peer.name)
            if best is None or result["output_tokens_per_s"] > best["output_tokens_per_s"]:
                setting = {}
                if peer.name == "hf-generate":
                    setting = {"batch_size": peer.batch_size}
                elif peer.name == "hf-continuous":
                    setting = {"max_requests": peer.max_num_seqs}
                elif peer.name == "llama.cpp":
                    setting = {"sequences": peer.n_seq}
                figures[peer.name] = {**result, **setting,
                                      "pagedchat_ratio": rows[-1]["pagedchat_ratio"]}
        report.emit_table("throughput", rows, ["engine", "requests_per_s", "output_tokens_per_s",
                                               "total_tokens_per_s", "pagedchat_ratio"])
        report.note(f"{len(requests)} ShareGPT requests, {rows[0]['prompt_tokens']} prompt + "
                    f"{rows[0]['output_tokens']} output tokens; pagedchat_ratio = pagedchat "
                    "output tokens/s / the engine's"
                    + (f" (median of {rounds} rounds, engines in turn, pagedchat first "
                       "in even rounds and last in odd ones)" if rounds > 1 else ""))
        extra: dict[str, object] = {"runs": rows}
        if ceiling:
            extra["ceiling"] = _ceiling(engine, figures["pagedchat"])
        if json_path:
            report.write_json(json_path, _meta(engine), figures, **extra)


def _median_run(results: list[dict[str, object]]) -> dict[str, object]:
    """The run of median output tokens/s (the lower middle one of an even count), with
    every run's figure beside it."""
    ranked = sorted(results, key=lambda result: result["output_tokens_per_s"])
    median = dict(ranked[(len(ranked) - 1) // 2])
    if len(results) > 1:
        median["rounds_output_tokens_per_s"] = [r["output_tokens_per_s"] for r in results]
    return median


def _step_profile(engine) -> dict[str, float]:
    """Seconds per step in each phase; ``forward`` holds the matrix work and attention,
    the other phases are the overhead around them."""
    timer = engine.runner.timer
    steps = max(timer.steps, 1)
    per_step = {f"{name}_ms": seconds * 1000 / steps for name, seconds in timer.seconds.items()}
    shares = timer.shares()
    report.emit_table("step profile", [{"phase": name, "ms_per_step": per_step[f"{name}_ms"],
                                        "share": shares[name]} for name in timer.seconds],
                      ["phase", "ms_per_step", "share"])
    return {**per_step, "overhead_share": 1 - shares.get("forward", 0.0) - shares.get(
        "logits", 0.0)}


def _ceiling(engine, ours: dict[str, object]) -> dict[str, object]:
    """The ceiling, and two shares of it: output tokens/s against the ceiling's tokens/s
    (prompt tokens count for nothing there), and the matrix FLOP/s of every token the run
    processed, prompts included, against the ceiling's FLOP/s (the usual model FLOP share)."""
    config = load_config(engine.model_files.folder)
    found = measure_ceiling(config, batch=engine.config.max_num_seqs)
    achieved = work_flops(config, ours["prompt_tokens"], ours["output_tokens"]) / ours[
        "duration_s"] / 1e9
    rows = []
    for name in ("float32", "bfloat16"):
        found[name]["output_share"] = ours["output_tokens_per_s"] / found[name]["tokens_per_s"]
        found[name]["flop_share"] = achieved / found[name]["gflop_per_s"]
        rows.append({"dtype": name, **found[name]})
    found["pagedchat_gflop_per_s"] = achieved
    report.emit_table("ceiling", rows, ["dtype", "product", "gflop_per_s", "tokens_per_s",
                                        "output_share", "flop_share"])
    report.note(f"matmul ceiling: one step of batch {found['batch']} with every layer's own "
                f"weights, the faster of torch's F.linear and the CPU kernels' product (oneDNN "
                f"on packed weights), {found['gflop_per_token']:.3f} GFLOP/token; pagedchat (in "
                f"{engine.config.dtype}) did {achieved:.1f} GFLOP/s of matrix work, prompts "
                "included; output_share = its output tokens/s / the ceiling's tokens/s")
    return found


# ---- serve and chatbot ------------------------------------------------------------------------
def _serve(title: str, options: EngineOptions, make_requests, rates: list[float],
           compare: list[str], batch_sizes: list[int], hf_page_size: int, seed: int,
           plot: Path, json_path: Path | None) -> None:
    engine = options.build()
    requests = make_requests(engine)
    warmup = warmup_prompt(engine.tokenizer)
    peers = make_peers(compare, engine, batch_sizes, hf_page_size)
    engines: dict[str, list[dict[str, object]]] = {}
    rows = []
    for index, rate in enumerate(rates):
        arrivals = poisson_arrivals(len(requests), rate, seed)
        if index:  # a fresh prefix cache for every rate; the last engine's pool goes first
            engine = None
            engine = options.build()
        for runner in [PagedChat(engine), *peers]:
            if isinstance(runner, PagedChat):  # pagedchat in another dtype starts cold too
                runner.reset()
            figures = {"request_rate": rate, **measure(runner, requests, warmup, arrivals)[0]}
            alone = sum(peer.name == runner.name for peer in peers) <= 1
            engines.setdefault(runner.name if alone else runner.label, []).append(figures)
            rows.append({"engine": runner.label, **_flat(figures)})
        del runner  # PagedChat's, when there are no peers, holds the engine
    report.emit_table(title, rows, [
        "engine", "request_rate", "requests_per_s", "ttft_ms_mean", "ttft_ms_p99",
        "tpot_ms_mean", "itl_ms_p99", "e2e_ms_mean", "normalized_latency_s_per_token"])
    report.plot_lines(plot, {name: [(f["request_rate"], f["normalized_latency_s_per_token"])
                                    for f in runs] for name, runs in engines.items()},
                      "request rate (req/s)", "normalized latency (s/token)",
                      f"{title}: {len(requests)} requests")
    if json_path:
        report.write_json(json_path, _meta(engine), engines)


@bench_app.command()
def serve(num_requests: NumRequests = 200, model: Model = None, max_tokens: MaxTokens = None,
          rate: Rates = "0.5,1,2", compare: Compare = "", hf_batch_size: HfBatch = "8",
          hf_page_size: HfPage = 256, seed: Seed = 0, block_size: BlockSize = 16,
          kv_blocks: KvBlocks = None, kv_memory: KvMemory = None, max_num_seqs: MaxSeqs = MAX_SEQS,
          dtype: Dtype = DType.float32, plot: Plot = Path("bench-serve.png"),
          json_path: JsonPath = None,
          tp: TensorParallelSize = 1) -> None:
    """Online serving: Poisson arrivals; TTFT, TPOT, ITL, e2e and normalized latency."""
    with _user_errors():
        options = _options(model, dtype, block_size, kv_blocks, kv_memory, max_num_seqs, tp)
        _serve("serve", options,
               lambda engine: sample_trace(engine, num_requests, seed, max_tokens),
               parse_list(rate, float), parse_peers(compare), parse_list(hf_batch_size, int),
               hf_page_size, seed, plot, json_path)


@bench_app.command()
def chatbot(num_requests: NumRequests = 100, model: Model = None, max_tokens: MaxTokens = 1024,
            context: Annotated[int, typer.Option("--context", min=16,
                                                 help="Keep the prompt's last N tokens.")] = 1024,
            rate: Rates = "0.5,1,2", compare: Compare = "", hf_batch_size: HfBatch = "8",
            hf_page_size: HfPage = 256, seed: Seed = 0, block_size: BlockSize = 16,
            kv_blocks: KvBlocks = None, kv_memory: KvMemory = None,
            max_num_seqs: MaxSeqs = MAX_SEQS, dtype: Dtype = DType.float32,
            plot: Plot = Path("bench-chatbot.png"), json_path: JsonPath = None,
            tp: TensorParallelSize = 1) -> None:
    """The paper's chatbot: multi-turn history + new message, last 1024 tokens kept."""
    with _user_errors():
        options = _options(model, dtype, block_size, kv_blocks, kv_memory, max_num_seqs, tp)
        _serve("chatbot", options,
               lambda engine: sharegpt.sample_chat_requests(
                   engine.tokenizer, num_requests, seed, context, max_tokens or 1024,
                   max_total_len=length_limit(engine)),
               parse_list(rate, float), parse_peers(compare), parse_list(hf_batch_size, int),
               hf_page_size, seed, plot, json_path)


# ---- memory -----------------------------------------------------------------------------------
@bench_app.command()
def memory(num_requests: NumRequests = 200, model: Model = None, max_tokens: MaxTokens = None,
           max_len: Annotated[int, typer.Option(
               "--max-len", help="What the max-length policy reserves per request.")] = 2048,
           seed: Seed = 0, block_size: BlockSize = 16, kv_blocks: KvBlocks = 512,
           max_num_seqs: MaxSeqs = MAX_SEQS, dtype: Dtype = DType.float32,
           plot: Plot = Path("bench-memory.png"), json_path: JsonPath = None,
           tp: TensorParallelSize = 1) -> None:
    """The paper's Fig. 2: KV memory holding token states vs reserved vs fragmented."""
    with _user_errors():
        engine = _options(model, dtype, block_size, kv_blocks, None, max_num_seqs, tp).build()
        requests = sample_trace(engine, num_requests, seed, max_tokens)
        cfg = engine.config
        capacity = cfg.num_kv_blocks * cfg.block_size
        tally = Tally(capacity)
        measure(PagedChat(engine, on_step=tally.add_paged), requests,
                warmup_prompt(engine.tokenizer))
        shares = {"pagedchat": tally.figures()}
        for policy in POLICIES:
            shares[policy] = simulate_contiguous(requests, policy, capacity, max_len,
                                                 cfg.max_num_seqs, cfg.max_num_batched_tokens)
        report.emit_table("memory", [{"engine": name, **f} for name, f in shares.items()],
                          ["engine", *PARTS, "live_of_allocated", "mean_batch_size",
                           "max_batch_size"])
        report.note(f"KV budget {capacity} token slots; pagedchat measured in the engine, the "
                    "reservation policies simulated on the same trace (see bench/memory.py); "
                    "shares averaged over steps with requests waiting")
        report.plot_stacked(plot, shares, list(PARTS), f"KV cache memory, {len(requests)} "
                            f"ShareGPT requests, {capacity} slots")
        if json_path:
            report.write_json(json_path, _meta(engine), shares, capacity_tokens=capacity,
                              max_len=max_len)


# ---- prefix, block size, preemption -------------------------------------------------------
@bench_app.command()
def prefix(num_requests: NumRequests = 100, model: Model = None, max_tokens: MaxTokens = 64,
           shots: Annotated[int, typer.Option("--shots", min=1,
                                              help="Examples in the shared prefix.")] = 5,
           seed: Seed = 0, block_size: BlockSize = 16, kv_blocks: KvBlocks = None,
           kv_memory: KvMemory = None, max_num_seqs: MaxSeqs = MAX_SEQS,
           dtype: Dtype = DType.float32,
           json_path: JsonPath = None,
           tp: TensorParallelSize = 1) -> None:
    """A shared few-shot prefix on every request, prefix caching on vs off."""
    with _user_errors():
        options = _options(model, dtype, block_size, kv_blocks, kv_memory, max_num_seqs, tp)
        figures: dict[str, dict[str, object]] = {}
        for caching in (True, False):
            engine = options.with_(enable_prefix_caching=caching).build()
            head = sharegpt.few_shot_prefix(engine.tokenizer, shots, seed)
            requests = [sharegpt.Request(r.id, head + r.prompt_ids, r.output_len) for r in
                        sharegpt.sample_alpaca_like(engine.tokenizer, num_requests, seed,
                                                    max_tokens)]
            # the warm-up carries the prefix, as the paper's provider caches it in advance
            result, runs = measure(PagedChat(engine), requests,
                                   head + warmup_prompt(engine.tokenizer))
            stats = engine.stats()
            figures["caching_on" if caching else "caching_off"] = {
                **result, "cached_tokens": sum(r.cached_tokens for r in runs),
                "prefix_hit_rate": stats.prefix_hit_rate}
        on, off = figures["caching_on"], figures["caching_off"]
        ratio = on["output_tokens_per_s"] / off["output_tokens_per_s"]
        report.emit_table("prefix", [{"engine": name, **f} for name, f in figures.items()],
                          ["engine", "requests_per_s", "output_tokens_per_s", "cached_tokens",
                           "prefix_hit_rate", "normalized_latency_s_per_token"])
        report.note(f"{shots}-shot prefix of {len(head)} tokens; throughput ratio on/off = "
                    f"{ratio:.2f}x")
        if json_path:
            report.write_json(json_path, _meta(engine), figures, prefix_tokens=len(head),
                              throughput_ratio=ratio)


@bench_app.command()
def blocksize(num_requests: NumRequests = 100, model: Model = None,
              max_tokens: MaxTokens = None,
              sizes: Annotated[str, typer.Option("--sizes", help="Block sizes to sweep.")]
              = "1,2,4,8,16,32,64,128,256",
              rate: Annotated[float | None, typer.Option(
                  "--rate", min=0.0, help="Poisson rate (req/s); default: all at once.")] = None,
              seed: Seed = 0, kv_memory: KvMemory = "512MiB", max_num_seqs: MaxSeqs = MAX_SEQS,
              dtype: Dtype = DType.float32, json_path: JsonPath = None,
              tp: TensorParallelSize = 1) -> None:
    """The block-size ablation: the same KV memory cut into blocks of each size."""
    with _user_errors():
        figures: dict[str, dict[str, object]] = {}
        for size in parse_list(sizes, int):
            engine = _options(model, dtype, size, None, kv_memory, max_num_seqs, tp).build()
            requests = sample_trace(engine, num_requests, seed, max_tokens)
            arrivals = poisson_arrivals(len(requests), rate, seed) if rate else None
            figures[str(size)] = measure(PagedChat(engine), requests,
                                         warmup_prompt(engine.tokenizer), arrivals)[0]
        report.emit_table("blocksize", [{"block_size": s, **_flat(f)} for s, f in
                                        figures.items()],
                          ["block_size", "requests_per_s", "output_tokens_per_s",
                           "e2e_ms_mean", "normalized_latency_s_per_token"])
        if json_path:
            report.write_json(json_path, _meta(engine), {"pagedchat": figures})


@bench_app.command()
def preemption(num_requests: NumRequests = 100, model: Model = None,
               max_tokens: MaxTokens = None, seed: Seed = 0, block_size: BlockSize = 16,
               kv_blocks: KvBlocks = 128, max_num_seqs: MaxSeqs = MAX_SEQS,
               dtype: Dtype = DType.float32, json_path: JsonPath = None,
               tp: TensorParallelSize = 1) -> None:
    """Recompute vs swap under memory pressure (a small KV pool)."""
    with _user_errors():
        figures: dict[str, dict[str, object]] = {}
        for mode in ("recompute", "swap"):
            engine = _options(model, dtype, block_size, kv_blocks, None, max_num_seqs, tp).with_(
                preemption_mode=mode).build()
            requests = sample_trace(engine, num_requests, seed, max_tokens)
            result = measure(PagedChat(engine), requests, warmup_prompt(engine.tokenizer))[0]
            stats = engine.stats()
            figures[mode] = {**result, "preemptions": stats.preemptions,
                             "swapped_out_blocks": stats.swapped_out,
                             "swapped_in_blocks": stats.swapped_in}
        report.emit_table("preemption", [{"mode": m, **f} for m, f in figures.items()],
                          ["mode", "requests_per_s", "output_tokens_per_s", "preemptions",
                           "swapped_out_blocks", "normalized_latency_s_per_token"])
        if json_path:
            report.write_json(json_path, _meta(engine), figures)


# ---- single stream and quality ----------------------------------------------------------------
@bench_app.command()
def latency(model: Model = None, max_tokens: MaxTokens = 128,
            prompt_len: Annotated[int, typer.Option(
                "--prompt-len", min=16, help="Tokens of the long prompt timed to first token.")]
            = 1000,
            dtype: Dtype = DType.float32,
            loads: Annotated[bool, typer.Option(
                help="Also time a first start (GGUF conversion) and a cached start.")] = True,
            json_path: JsonPath = None,
            tp: TensorParallelSize = 1,
            rounds: Annotated[int, typer.Option(
                "--rounds", min=1,
                help="Time both engines this many times, in turn; each figure is the "
                     "median and each ratio the median of the rounds' ratios.")] = 3,
            compare: Annotated[str, typer.Option(
                "--compare", help="Peers: hf-generate, llama.cpp (on the same GGUF file and "
                                  "threads; needs the [peers] extra); empty: none.")]
            = "hf-generate") -> None:
    """Single stream: decode tokens/s, time to first token of a long prompt, load times,
    and decode's share of the machine's copy bandwidth."""
    from pagedchat.bench.bandwidth import memory_speed
    from pagedchat.bench.latency import compare_single_stream, load_times, single_stream_peers
    from pagedchat.bench.llamacpp import check_tokens

    with _user_errors():
        engine = _options(model, dtype, tp=tp).build()
        long_prompt = sharegpt.long_prompt(engine.tokenizer, prompt_len)
        short_prompt = warmup_prompt(engine.tokenizer)
        peers = single_stream_peers(parse_list(compare), engine)
        figures = compare_single_stream(engine, short_prompt, long_prompt, max_tokens or 128,
                                        rounds, peers)
        extra: dict[str, object] = {"memory_speed": memory_speed(
            engine, figures, len(short_prompt) + (max_tokens or 128) / 2)}
        rows = [{"engine": name, **f} for name, f in figures.items()]
        report.emit_table("latency", rows, ["engine", "decode_tokens_per_s", "ttft_ms",
                                            "decode_ratio", "ttft_ratio", "bytes_per_token_mb",
                                            "bandwidth_share"])
        report.note(f"decode after a short prompt, {max_tokens or 128} tokens; TTFT of a "
                    f"{len(long_prompt)}-token prompt; ratios: pagedchat over the engine"
                    + (f" (medians of {rounds} rounds, engines in turn)" if rounds > 1 else ""))
        if "llama.cpp" in peers:
            extra["llama.cpp"] = {**peers["llama.cpp"].build(),
                                  "tokens": check_tokens(engine, peers["llama.cpp"])}
        if loads:
            extra["load"] = load_times(model)
            report.emit_table("load", [extra["load"]], ["first_load_s", "cached_load_s"])
        if json_path:
            report.write_json(json_path, _meta(engine), figures, **extra)


@bench_app.command()
def quality(num_requests: NumRequests = 16, model: Model = None, max_tokens: MaxTokens = 32,
            dtype: Dtype = DType.bfloat16, seed: Seed = 0, json_path: JsonPath = None,
            tp: TensorParallelSize = 1) -> None:
    """Greedy agreement with transformers at a lower precision, beside its noise floor."""
    from pagedchat.bench.quality import greedy_agreement

    with _user_errors():
        engine = _options(model, dtype, tp=tp).build()
        requests = sample_trace(engine, num_requests, seed, max_tokens)
        figures = greedy_agreement(engine, [r.prompt_ids for r in requests], max_tokens or 32)
        report.emit_table("quality", [{"dtype": engine.config.dtype, **figures}],
                          ["dtype", "prompts", "first_token_agreement",
                           "mean_shared_prefix_tokens", "hf_vs_hf_float32_first_token_agreement",
                           "hf_vs_hf_float32_mean_shared_prefix_tokens"])
        if json_path:
            report.write_json(json_path, _meta(engine), {"pagedchat": figures})


@bench_app.command()
def sharing(num_requests: NumRequests = 24, model: Model = None, max_tokens: MaxTokens = 128,
            widths: Annotated[str, typer.Option(
                "--widths", help="n for parallel sampling and beam widths, e.g. 2,4,6.")]
            = "2,4,6",
            seed: Seed = 0, json_path: JsonPath = None,
            tp: TensorParallelSize = 1) -> None:
    """The paper's Fig. 15: KV memory saved by sharing, parallel sampling and beam search."""
    from pagedchat.bench.sharing import COLUMNS, measure_sharing

    with _user_errors():
        engine = _options(model, DType.float32.value, tp=tp).build()
        rows = measure_sharing(engine, num_requests, max_tokens, seed, parse_list(widths, int))
        report.emit_table("sharing", rows, COLUMNS)
        if json_path:
            report.write_json(json_path, _meta(engine), {"pagedchat": rows})


# ---- tensor parallelism -----------------------------------------------------------------------
@bench_app.command()
def parallel(num_requests: NumRequests = 32, model: Model = None, max_tokens: MaxTokens = 64,
             sizes: Annotated[str, typer.Option(
                 "--sizes", callback=_check_sizes,
                 help="Tensor-parallel sizes to run, e.g. 1,3.")] = "1,3",
             seed: Seed = 0, kv_blocks: KvBlocks = None, dtype: Dtype = DType.float32,
             json_path: JsonPath = None) -> None:
    """Throughput for each tensor-parallel size on the same requests, with the bytes
    all-reduced per token and broadcast per step, next to the model's size."""
    from pagedchat.bench.parallel import communication_figures

    with _user_errors():
        options = _options(model, dtype, kv_blocks=kv_blocks)
        figures: dict[str, dict[str, object]] = {}
        rows, requests, meta = [], None, {}
        for size in parse_list(sizes, int):
            engine = options.with_(tensor_parallel_size=size).build()
            try:
                if requests is None:
                    requests = sample_trace(engine, num_requests, seed, max_tokens)
                    meta = _meta(engine)
                result = measure(PagedChat(engine), requests,
                                 warmup_prompt(engine.tokenizer))[0]
                result.update(communication_figures(engine))
            finally:
                engine.shutdown()
            figures[f"pagedchat-tp{size}"] = result
            rows.append({"engine": f"pagedchat tp={size}", **result})
        base = rows[0]["output_tokens_per_s"]
        for row in rows:
            row["speedup"] = row["output_tokens_per_s"] / base
        report.emit_table("tensor parallelism", rows, [
            "engine", "output_tokens_per_s", "speedup", "all_reduce_bytes_per_token",
            "expected_all_reduce_bytes_per_token", "all_reduce_mb_per_step",
            "broadcast_bytes_per_step", "weights_per_worker_mb"])
        report.note(f"{len(requests)} ShareGPT requests; model weights "
                    f"{rows[0]['weights_per_worker_mb']:.0f} MB on one worker; speedup = "
                    "output tokens/s against the first size")
        if json_path:
            report.write_json(json_path, meta, figures)


# ---- batch ------------------------------------------------------------------------------------
def batch(
    input_path: Annotated[str, typer.Argument(metavar="IN", help="JSONL requests; - = stdin.")],
    output: Annotated[str, typer.Option("-o", "--output", metavar="OUT",
                                        help="JSONL results, appended; - = stdout.")] = "-",
    model: Model = None,
    system: Annotated[str | None, typer.Option(
        "--system", help="A system prompt shared by every line (its KV blocks are shared).")]
    = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1,
                                            help="Default max_tokens of a line.")] = 256,
    temperature: Annotated[float | None, typer.Option(
        "--temperature", min=0.0, help="Default temperature of a line (0 = greedy).")] = None,
    kv_blocks: KvBlocks = None,
    kv_memory: KvMemory = None,
    tp: TensorParallelSize = 1,
) -> None:
    """Run a JSONL file of prompts through the engine; resumable (reruns skip done ids)."""
    from pagedchat.chat.batch import describe, load_done, run_batch

    with _user_errors():
        if input_path != "-" and not Path(input_path).is_file():
            raise FileNotFoundError(f"{input_path}: no such file")
        done = load_done(Path(output)) if output != "-" else {}
        lines = (sys.stdin if input_path == "-" else
                 Path(input_path).open(encoding="utf-8")).read().splitlines()
        engine = EngineOptions(model=model, num_kv_blocks=kv_blocks, kv_cache_memory=kv_memory,
                               tensor_parallel_size=tp).build()
        defaults: dict[str, object] = {"max_tokens": max_tokens}
        if temperature is not None:
            defaults["temperature"] = temperature
        sink = sys.stdout if output == "-" else open(output, "a", encoding="utf-8")
        try:
            with report.progress("batch", sum(1 for t in lines if t.strip())) as advance:
                summary = run_batch(engine, lines, sink, done, system, defaults,
                                    warn=lambda m: report.note(f"[yellow]{m}[/yellow]"),
                                    progress=advance)
        finally:
            if sink is not sys.stdout:
                sink.close()
        report.note(describe(summary))
    raise typer.Exit(summary.exit_code)


# ---- inspect ----------------------------------------------------------------------------------
class Preemption(str, Enum):
    recompute = "recompute"
    swap = "swap"


def inspect(
    prompt: Annotated[list[str] | None, typer.Option(
        "--prompt", help="Run this prompt instead of the default scenario (repeatable).")]
    = None,
    file: Annotated[Path | None, typer.Option(
        "--file", help="Prompts to run, one a line.")] = None,
    step: Annotated[bool, typer.Option("--step", help="Wait for Enter between steps "
                                                      "(q + Enter quits).")] = False,
    json_path: JsonPath = None,
    kv_blocks: Annotated[int, typer.Option("--kv-blocks", min=1,
                                           help="KV pool size in blocks.")] = 128,
    block_size: BlockSize = 16,
    preemption_mode: Annotated[Preemption, typer.Option(
        "--preemption", help="What a full pool does to the newest request.")]
    = Preemption.recompute,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1,
                                            help="Tokens to generate per request.")] = 24,
    max_steps: Annotated[int, typer.Option("--max-steps", min=1)] = 500,
    model: Model = None,
) -> None:
    """Watch the KV block pool, block tables and sharing, one engine step at a time."""
    from pagedchat.bench import render
    from pagedchat.bench.inspect import default_scenario, prompt_scenario, run_scenario

    with _user_errors():
        prompts = list(prompt or [])
        if file is not None:
            if not file.is_file():
                raise FileNotFoundError(f"{file}: no such file")
            prompts += [t for t in file.read_text(encoding="utf-8").splitlines() if t.strip()]
        engine = EngineOptions(model=model, block_size=block_size, num_kv_blocks=kv_blocks,
                               preemption_mode=Preemption(preemption_mode).value).build()
        arrivals = (prompt_scenario(prompts, max_tokens) if prompts
                    else default_scenario(engine.tokenizer, max_tokens))

        def show(snapshot) -> bool:
            title = f"step {snapshot.step}" + "".join(f" | {e}" for e in snapshot.events)
            report.stdout.print(render.snapshot(title, snapshot.stats))
            if not step:
                return True
            answer = sys.stdin.readline()
            return answer.strip().lower() != "q"

        snapshots = run_scenario(engine, arrivals, show, max_steps)
        if json_path:
            json_path.write_text(json.dumps({"metadata": _meta(engine), "snapshots": [
                s.to_json() for s in snapshots]}, indent=1) + "\n")
            report.note(f"{len(snapshots)} snapshots written to {json_path}")
