"""`pagedchat bench parallel`: throughput and traffic for each tensor-parallel size."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli.options import user_errors
from pagedchat_lab.cli import options as opt


def parallel(num_requests: opt.NumRequests = 32, model: opt.Model = None,
             max_tokens: opt.MaxTokens = 64,
             sizes: Annotated[str, typer.Option(
                 "--sizes", callback=opt.check_sizes,
                 help="Tensor-parallel sizes to run, e.g. 1,3.")] = "1,3",
             seed: opt.Seed = 0, kv_blocks: opt.KvBlocks = None,
             dtype: opt.DTypeOption = opt.DType.float32,
             weights: opt.Weights = None,
             json_path: opt.JsonPath = None) -> None:
    """Throughput for each tensor-parallel size on the same requests, with the bytes
    all-reduced per token and broadcast per step, next to the model's size."""
    from pagedchat_lab import report
    from pagedchat_lab.engines import PagedChat
    from pagedchat_lab.parallel import communication_figures
    from pagedchat_lab.suite import measure, parse_list, sample_trace, warmup_prompt

    with user_errors():
        options = opt.engine_options(model, dtype, kv_blocks=kv_blocks, weights=weights)
        figures: dict[str, dict[str, object]] = {}
        rows, requests, meta = [], None, {}
        for size in parse_list(sizes, int):
            engine = options.with_(tensor_parallel_size=size).build()
            try:
                if requests is None:
                    requests = sample_trace(engine, num_requests, seed, max_tokens)
                    meta = console.engine_metadata(engine)
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
        console.note(f"{len(requests)} ShareGPT requests; model weights "
                     f"{rows[0]['weights_per_worker_mb']:.0f} MB on one worker; speedup = "
                     "output tokens/s against the first size")
        if json_path:
            report.write_json(json_path, meta, figures)
