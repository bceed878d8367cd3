"""`pagedchat bench memory`: KV bytes per token of context against a cache that keeps every
layer (what sliding-window layers save), and where the KV cache's memory goes over a
ShareGPT trace (the paper's Fig. 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli.options import KvCacheDtype, user_errors
from pagedchat_lab.cli import options as opt

TraceRequests = Annotated[int | None, typer.Option(
    "-n", "--num-requests", min=0,
    help="Requests sampled from the trace for Fig. 2; 0 skips it. Default: 200, or 0 for a "
         "model with sliding-window layers (the contiguous policies know no windows).")]
Contexts = Annotated[str, typer.Option(
    "--contexts", callback=opt.check_sizes,
    help="Context lengths at which to count the KV bytes one sequence holds per token.")]
RunModel = Annotated[bool, typer.Option(
    "--run-model/--no-run-model",
    help="Count the blocks held in the engine running the model (prefill and a decode "
         "step; needs --kv-blocks to hold the longest context) instead of driving the "
         "engine's scheduler and block manager alone (the same counts, no forward pass).")]


def memory(num_requests: TraceRequests = None, model: opt.Model = None,
           max_tokens: opt.MaxTokens = None,
           max_len: Annotated[int, typer.Option(
               "--max-len", help="What the max-length policy reserves per request.")] = 2048,
           seed: opt.Seed = 0, block_size: opt.BlockSize = 16, kv_blocks: opt.KvBlocks = 512,
           max_num_seqs: opt.MaxSeqs = opt.MAX_SEQS, dtype: opt.DTypeOption = opt.DType.float32,
           weights: opt.Weights = None, contexts: Contexts = "1024,4096,16384",
           run_model: RunModel = False,
           plot: opt.Plot = Path("bench-memory.png"), json_path: opt.JsonPath = None,
           tp: opt.TensorParallelSize = 1, kv_cache_dtype: KvCacheDtype = "auto") -> None:
    """KV bytes per token by context length, against keeping every layer; then the paper's
    Fig. 2: KV memory holding token states vs reserved vs fragmented."""
    from pagedchat_lab import report
    from pagedchat_lab.suite import parse_list
    with user_errors():
        engine = opt.engine_options(model, dtype, block_size, kv_blocks, None, max_num_seqs, tp,
                                    weights=weights, kv_cache_dtype=kv_cache_dtype).build()
        by_context = _by_context(engine, parse_list(contexts, int), run_model)
        windowed = engine.scheduler.block_manager.has_windows
        num_requests = num_requests if num_requests is not None else (0 if windowed else 200)
        shares = _trace_shares(engine, num_requests, seed, max_tokens, max_len, plot)
        cfg = engine.config
        report.save(json_path, engine, shares, capacity_tokens=cfg.num_kv_blocks * cfg.block_size,
                    max_len=max_len, by_context=by_context)


def _by_context(engine, lengths: list[int], run_model: bool) -> list[dict[str, object]]:
    """The per-context table, printed; lengths past the model's context are left out."""
    from pagedchat_lab import context_memory, report
    limit = engine.config.max_model_len
    fits = [n for n in lengths if n + 3 <= limit]
    if len(fits) < len(lengths):
        console.note(f"left out {', '.join(str(n) for n in lengths if n not in fits)} tokens: "
                     f"the model's context is {limit} tokens")
    rows = [context_memory.measure(engine, n, run_model).row() for n in fits]
    if rows:
        report.emit_table("kv per token", rows, context_memory.COLUMNS)
        how = ("the engine running the model" if run_model else
               "the engine's scheduler and block manager on the model's layer groups, with "
               "no forward pass (allocation does not depend on the values)")
        console.note(f"one sequence's blocks while it computes the token at each context "
                     f"length, counted in {how}; full: every layer's K and V for every token; "
                     f"K/V in {engine.kv_cache_dtype}")
    return rows


def _trace_shares(engine, num_requests: int, seed: int, max_tokens: int | None,
                  max_len: int, plot: Path) -> dict[str, dict[str, float]]:
    """Fig. 2 over ``num_requests`` ShareGPT requests (none: nothing run)."""
    from pagedchat_lab import report
    from pagedchat_lab.engines import PagedChat
    from pagedchat_lab.memory import PARTS, POLICIES, Tally, simulate_contiguous
    from pagedchat_lab.suite import measure, sample_trace, warmup_prompt
    if not num_requests:
        return {}
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
    console.note(f"KV budget {capacity} token slots; pagedchat measured in the engine, the "
                 "reservation policies simulated on the same trace (see bench/memory.py); "
                 "shares averaged over steps with requests waiting")
    report.plot_stacked(plot, shares, list(PARTS), f"KV cache memory, {len(requests)} "
                        f"ShareGPT requests, {capacity} slots")
    return shares
