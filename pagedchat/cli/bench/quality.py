"""`pagedchat bench quality`: greedy agreement with transformers at a lower precision."""

from __future__ import annotations

from pagedchat.bench import report
from pagedchat.bench.suite import sample_trace
from pagedchat.cli.bench import options as opt
from pagedchat.cli.options import user_errors


def quality(num_requests: opt.NumRequests = 16, model: opt.Model = None,
            max_tokens: opt.MaxTokens = 32,
            dtype: opt.Dtype = opt.DType.bfloat16,
            weights: opt.Weights = None, seed: opt.Seed = 0, json_path: opt.JsonPath = None,
            tp: opt.TensorParallelSize = 1) -> None:
    """Greedy agreement with transformers at a lower precision, beside its noise floor."""
    from pagedchat.bench.quality import greedy_agreement

    with user_errors():
        engine = opt.engine_options(model, dtype, tp=tp, weights=weights).build()
        requests = sample_trace(engine, num_requests, seed, max_tokens)
        figures = greedy_agreement(engine, [r.prompt_ids for r in requests], max_tokens or 32)
        report.emit_table("quality", [{"dtype": engine.config.dtype, **figures}],
                          ["dtype", "prompts", "first_token_agreement",
                           "mean_shared_prefix_tokens", "hf_vs_hf_float32_first_token_agreement",
                           "hf_vs_hf_float32_mean_shared_prefix_tokens"])
        if json_path:
            report.write_json(json_path, report.engine_metadata(engine), {"pagedchat": figures})
