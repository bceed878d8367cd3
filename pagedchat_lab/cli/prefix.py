"""`pagedchat bench prefix`: a shared few-shot prefix, prefix caching on vs off."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli.options import user_errors
from pagedchat_lab.cli import options as opt


def prefix(num_requests: opt.NumRequests = 100, model: opt.Model = None,
           max_tokens: opt.MaxTokens = 64,
           shots: Annotated[int, typer.Option("--shots", min=1,
                                              help="Examples in the shared prefix.")] = 5,
           seed: opt.Seed = 0, block_size: opt.BlockSize = 16, kv_blocks: opt.KvBlocks = None,
           kv_memory: opt.KvMemory = None, max_num_seqs: opt.MaxSeqs = opt.MAX_SEQS,
           dtype: opt.DTypeOption = opt.DType.float32,
           weights: opt.Weights = None,
           json_path: opt.JsonPath = None,
           tp: opt.TensorParallelSize = 1) -> None:
    """A shared few-shot prefix on every request, prefix caching on vs off."""
    from pagedchat_lab import report, sharegpt
    from pagedchat_lab.engines import PagedChat
    from pagedchat_lab.suite import measure, warmup_prompt
    with user_errors():
        options = opt.engine_options(model, dtype, block_size, kv_blocks, kv_memory,
                                     max_num_seqs, tp, weights=weights)
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
        console.note(f"{shots}-shot prefix of {len(head)} tokens; throughput ratio on/off = "
                     f"{ratio:.2f}x")
        report.save(json_path, engine, figures, prefix_tokens=len(head), throughput_ratio=ratio)
