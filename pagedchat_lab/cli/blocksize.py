"""`pagedchat bench blocksize`: the block-size ablation on one KV memory budget."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat.cli.options import user_errors
from pagedchat_lab.cli import options as opt


def blocksize(num_requests: opt.NumRequests = 100, model: opt.Model = None,
              max_tokens: opt.MaxTokens = None,
              sizes: Annotated[str, typer.Option("--sizes", help="Block sizes to sweep.")]
              = "1,2,4,8,16,32,64,128,256",
              rate: Annotated[float | None, typer.Option(
                  "--rate", min=0.0, help="Poisson rate (req/s); default: all at once.")] = None,
              seed: opt.Seed = 0, kv_memory: opt.KvMemory = "512MiB",
              max_num_seqs: opt.MaxSeqs = opt.MAX_SEQS, dtype: opt.DTypeOption = opt.DType.float32,
              weights: opt.Weights = None, json_path: opt.JsonPath = None,
              tp: opt.TensorParallelSize = 1) -> None:
    """The block-size ablation: the same KV memory cut into blocks of each size."""
    from pagedchat_lab import report
    from pagedchat_lab.engines import PagedChat
    from pagedchat_lab.suite import (
        measure,
        parse_list,
        poisson_arrivals,
        sample_trace,
        warmup_prompt,
    )
    with user_errors():
        figures: dict[str, dict[str, object]] = {}
        for size in parse_list(sizes, int):
            engine = opt.engine_options(model, dtype, size, None, kv_memory, max_num_seqs, tp,
                                        weights=weights).build()
            requests = sample_trace(engine, num_requests, seed, max_tokens)
            arrivals = poisson_arrivals(len(requests), rate, seed) if rate else None
            figures[str(size)] = measure(PagedChat(engine), requests,
                                         warmup_prompt(engine.tokenizer), arrivals)[0]
        report.emit_table("blocksize", [{"block_size": s, **report.flatten(f)} for s, f in
                                        figures.items()],
                          ["block_size", "requests_per_s", "output_tokens_per_s",
                           "e2e_ms_mean", "normalized_latency_s_per_token"])
        report.save(json_path, engine, {"pagedchat": figures})
