"""`pagedchat bench quality`: greedy agreement with transformers at a lower precision."""

from __future__ import annotations

from pagedchat.bench import report
from pagedchat.bench.suite import (
    sample_trace,
)
from pagedchat.cli.bench.options import (
    DType,
    Dtype,
    MaxTokens,
    NumRequests,
    Seed,
    engine_options,
)
from pagedchat.cli.options import (
    JsonPath,
    Model,
    TensorParallelSize,
    Weights,
    user_errors,
)


def quality(num_requests: NumRequests = 16, model: Model = None, max_tokens: MaxTokens = 32,
            dtype: Dtype = DType.bfloat16,
            weights: Weights = None, seed: Seed = 0, json_path: JsonPath = None,
            tp: TensorParallelSize = 1) -> None:
    """Greedy agreement with transformers at a lower precision, beside its noise floor."""
    from pagedchat.bench.quality import greedy_agreement

    with user_errors():
        engine = engine_options(model, dtype, tp=tp, weights=weights).build()
        requests = sample_trace(engine, num_requests, seed, max_tokens)
        figures = greedy_agreement(engine, [r.prompt_ids for r in requests], max_tokens or 32)
        report.emit_table("quality", [{"dtype": engine.config.dtype, **figures}],
                          ["dtype", "prompts", "first_token_agreement",
                           "mean_shared_prefix_tokens", "hf_vs_hf_float32_first_token_agreement",
                           "hf_vs_hf_float32_mean_shared_prefix_tokens"])
        if json_path:
            report.write_json(json_path, report.engine_metadata(engine), {"pagedchat": figures})
