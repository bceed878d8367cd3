"""`pagedchat bench preemption`: recompute vs swap under memory pressure."""

from __future__ import annotations

from pagedchat.cli.options import user_errors
from pagedchat_lab.cli import options as opt


def preemption(num_requests: opt.NumRequests = 100, model: opt.Model = None,
               max_tokens: opt.MaxTokens = None, seed: opt.Seed = 0,
               block_size: opt.BlockSize = 16, kv_blocks: opt.KvBlocks = 128,
               max_num_seqs: opt.MaxSeqs = opt.MAX_SEQS, dtype: opt.DTypeOption = opt.DType.float32,
               weights: opt.Weights = None, json_path: opt.JsonPath = None,
               tp: opt.TensorParallelSize = 1) -> None:
    """Recompute vs swap under memory pressure (a small KV pool)."""
    from pagedchat_lab import report
    from pagedchat_lab.engines import PagedChat
    from pagedchat_lab.suite import measure, sample_trace, warmup_prompt
    with user_errors():
        figures: dict[str, dict[str, object]] = {}
        for mode in ("recompute", "swap"):
            options = opt.engine_options(model, dtype, block_size, kv_blocks, None, max_num_seqs,
                                         tp, weights=weights)
            engine = options.with_(preemption_mode=mode).build()
            requests = sample_trace(engine, num_requests, seed, max_tokens)
            result = measure(PagedChat(engine), requests, warmup_prompt(engine.tokenizer))[0]
            stats = engine.stats()
            figures[mode] = {**result, "preemptions": stats.preemptions,
                             "swapped_out_blocks": stats.swapped_out,
                             "swapped_in_blocks": stats.swapped_in}
        report.emit_table("preemption", [{"mode": m, **f} for m, f in figures.items()],
                          ["mode", "requests_per_s", "output_tokens_per_s", "preemptions",
                           "swapped_out_blocks", "normalized_latency_s_per_token"])
        report.save(json_path, engine, figures)
