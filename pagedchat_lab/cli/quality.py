"""`pagedchat bench quality`: greedy agreement with transformers at a lower precision (or
with 8-bit activations), and the perplexity of held-out text."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli.options import KvCacheDtype, user_errors
from pagedchat_lab.cli import options as opt


def quality(num_requests: opt.NumRequests = 16, model: opt.Model = None,
            max_tokens: opt.MaxTokens = 32,
            dtype: opt.DTypeOption = opt.DType.bfloat16,
            weights: opt.Weights = None, seed: opt.Seed = 0, json_path: opt.JsonPath = None,
            tp: opt.TensorParallelSize = 1,
            replies: Annotated[int, typer.Option(
                "--replies", min=0, help="Held-out ShareGPT answers to score (0: none).")] = 16,
            kv_cache_dtype: KvCacheDtype = "auto",
            ) -> None:
    """Greedy agreement with transformers at a lower precision, beside its noise floor,
    and the perplexity of held-out answers under both. With --kv-cache-dtype int8: against
    the same engine with K/V in --dtype instead (use --dtype float32 for float32 K/V)."""
    from pagedchat_lab import report
    from pagedchat_lab.quality import greedy_agreement, held_out_perplexity
    from pagedchat_lab.sharegpt import sample_replies
    from pagedchat_lab.suite import sample_trace

    if kv_cache_dtype != "auto":
        _kv_quality(num_requests, model, max_tokens, dtype, weights, seed, json_path, replies,
                    kv_cache_dtype)
        return
    with user_errors():
        engine = opt.engine_options(model, dtype, tp=tp, weights=weights).build()
        requests = sample_trace(engine, num_requests, seed, max_tokens)
        figures = greedy_agreement(engine, [r.prompt_ids for r in requests], max_tokens or 32)
        if replies:
            figures |= held_out_perplexity(engine, sample_replies(engine.tokenizer, replies, seed))
        row = {"dtype": engine.config.dtype, "weights": engine.config.weights, **figures}
        report.emit_table("quality", [row], [
            "dtype", "weights", "prompts", "first_token_agreement", "mean_shared_prefix_tokens",
            "hf_vs_hf_float32_first_token_agreement",
            "hf_vs_hf_float32_mean_shared_prefix_tokens",
            *(["replies", "reply_tokens", "perplexity", "hf_float32_perplexity"]
              if replies else [])])
        report.save(json_path, engine, {"pagedchat": figures})


def _kv_quality(num_requests, model, max_tokens, dtype, weights, seed, json_path, replies,
                kv_cache_dtype) -> None:
    """Agreement and perplexity of quantized K/V against K/V in the engine's dtype."""
    from pagedchat_lab import report
    from pagedchat_lab.kv_cache import agreement, perplexity
    from pagedchat_lab.sharegpt import sample_replies
    from pagedchat_lab.suite import sample_trace

    with user_errors():
        base = opt.engine_options(model, dtype, weights=weights)
        plain = base.build()
        quantized = base.with_(kv_cache_dtype=kv_cache_dtype).build()
        requests = sample_trace(plain, num_requests, seed, max_tokens)
        figures = agreement(quantized, plain, [r.prompt_ids for r in requests],
                            max_tokens or 32)
        if replies:
            figures |= perplexity(quantized, plain,
                                  sample_replies(plain.tokenizer, replies, seed))
        row = {"kv_dtype": quantized.kv_cache_dtype, "against": plain.kv_cache_dtype,
               **figures}
        report.emit_table("kv quality", [row], list(row))
        console.note("token_agreement: the plain engine's greedy tokens forced through the "
                     "quantized one, the share it would have chosen itself; the rest free-run")
        report.save(json_path, quantized, {"pagedchat": row})
