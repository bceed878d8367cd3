"""`pagedchat bench latency`: single-stream decode, time to first token, load times."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat.bench import report, sharegpt
from pagedchat.bench.suite import (
    warmup_prompt,
)
from pagedchat.cli.bench.options import (
    DType,
    Dtype,
    MaxTokens,
    engine_options,
)
from pagedchat.cli.options import (
    JsonPath,
    Model,
    TensorParallelSize,
    Weights,
    user_errors,
)


def latency(model: Model = None, max_tokens: MaxTokens = 128,
            prompt_len: Annotated[int, typer.Option(
                "--prompt-len", min=16, help="Tokens of the long prompt timed to first token.")]
            = 1000,
            dtype: Dtype = DType.float32,
            weights: Weights = None,
            loads: Annotated[bool, typer.Option(
                help="Also time a first start (GGUF conversion) and a cached start.")] = True,
            json_path: JsonPath = None,
            tp: TensorParallelSize = 1,
            rounds: Annotated[int, typer.Option(
                "--rounds", min=1,
                help="Time both engines this many times, in turn; each figure is the "
                     "median and each ratio the median of the rounds' ratios.")] = 3) -> None:
    """Single stream: decode tokens/s, time to first token of a long prompt, load times."""
    from pagedchat.bench.latency import compare_single_stream, load_times

    with user_errors():
        engine = engine_options(model, dtype, tp=tp, weights=weights).build()
        long_prompt = sharegpt.long_prompt(engine.tokenizer, prompt_len)
        short_prompt = warmup_prompt(engine.tokenizer)
        figures = compare_single_stream(engine, short_prompt, long_prompt, max_tokens or 128,
                                        rounds)
        rows = [{"engine": name, **f} for name, f in figures.items()]
        report.emit_table("latency", rows, ["engine", "decode_tokens_per_s", "ttft_ms",
                                            "decode_ratio", "ttft_ratio"])
        report.note(f"decode after a short prompt, {max_tokens or 128} tokens; TTFT of a "
                    f"{len(long_prompt)}-token prompt; ratios: pagedchat over the engine"
                    + (f" (medians of {rounds} rounds, engines in turn)" if rounds > 1 else ""))
        extra: dict[str, object] = {}
        if loads:
            extra["load"] = load_times(model)
            report.emit_table("load", [extra["load"]], ["first_load_s", "cached_load_s"])
        if json_path:
            report.write_json(json_path, report.engine_metadata(engine), figures, **extra)
