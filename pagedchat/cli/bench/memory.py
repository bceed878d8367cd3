"""`pagedchat bench memory`: where the KV cache's memory goes (the paper's Fig. 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagedchat.bench import report
from pagedchat.bench.engines import PagedChat
from pagedchat.bench.memory import PARTS, POLICIES, Tally, simulate_contiguous
from pagedchat.bench.suite import (
    measure,
    sample_trace,
    warmup_prompt,
)
from pagedchat.cli.bench.options import (
    MAX_SEQS,
    DType,
    Dtype,
    MaxSeqs,
    MaxTokens,
    NumRequests,
    Plot,
    Seed,
    engine_options,
)
from pagedchat.cli.options import (
    BlockSize,
    JsonPath,
    KvBlocks,
    Model,
    TensorParallelSize,
    Weights,
    user_errors,
)


def memory(num_requests: NumRequests = 200, model: Model = None, max_tokens: MaxTokens = None,
           max_len: Annotated[int, typer.Option(
               "--max-len", help="What the max-length policy reserves per request.")] = 2048,
           seed: Seed = 0, block_size: BlockSize = 16, kv_blocks: KvBlocks = 512,
           max_num_seqs: MaxSeqs = MAX_SEQS, dtype: Dtype = DType.float32,
           weights: Weights = None,
           plot: Plot = Path("bench-memory.png"), json_path: JsonPath = None,
           tp: TensorParallelSize = 1) -> None:
    """The paper's Fig. 2: KV memory holding token states vs reserved vs fragmented."""
    with user_errors():
        engine = engine_options(model, dtype, block_size, kv_blocks, None, max_num_seqs, tp,
                                weights=weights).build()
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
            report.write_json(json_path, report.engine_metadata(engine), shares,
                              capacity_tokens=capacity, max_len=max_len)
