"""`pagedchat bench latency`: single-stream decode, time to first token, load times."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli.options import user_errors
from pagedchat_lab.cli import options as opt


def latency(model: opt.Model = None, max_tokens: opt.MaxTokens = 128,
            prompt_len: Annotated[int, typer.Option(
                "--prompt-len", min=16, help="Tokens of the long prompt timed to first token.")]
            = 1000,
            dtype: opt.DTypeOption = opt.DType.float32, weights: opt.Weights = None,
            loads: Annotated[bool, typer.Option(
                help="Also time a first start (GGUF conversion) and a cached start.")] = True,
            json_path: opt.JsonPath = None, tp: opt.TensorParallelSize = 1,
            rounds: Annotated[int, typer.Option(
                "--rounds", min=1,
                help="Time both engines this many times, in turn; each figure is the "
                     "median and each ratio the median of the rounds' ratios.")] = 3,
            compare: Annotated[str, typer.Option(
                "--compare", help="Peers: hf-generate, llama.cpp (on the same GGUF file and "
                                  "threads; needs the [peers] extra); empty: none.")]
            = "hf-generate") -> None:
    """Single stream: decode tokens/s, time to first token of a long prompt, load times,
    and decode's share of the machine's copy bandwidth."""
    from pagedchat_lab import report, sharegpt
    from pagedchat_lab.bandwidth import memory_speed
    from pagedchat_lab.latency import (
        check_single_stream_peers,
        compare_single_stream,
        load_times,
        single_stream_peers,
    )
    from pagedchat_lab.llamacpp import check_tokens
    from pagedchat_lab.suite import parse_list, warmup_prompt

    with user_errors():
        names = check_single_stream_peers(parse_list(compare))  # before a model is loaded
        engine = opt.engine_options(model, dtype, tp=tp, weights=weights).build()
        long_prompt = sharegpt.long_prompt(engine.tokenizer, prompt_len)
        short_prompt = warmup_prompt(engine.tokenizer)
        peers = single_stream_peers(names, engine)
        figures = compare_single_stream(engine, short_prompt, long_prompt, max_tokens or 128,
                                        rounds, peers)
        extra: dict[str, object] = {"memory_speed": memory_speed(
            engine, figures, len(short_prompt) + (max_tokens or 128) / 2)}
        rows = [{"engine": name, **f} for name, f in figures.items()]
        report.emit_table("latency", rows, ["engine", "decode_tokens_per_s", "ttft_ms",
                                            "decode_ratio", "ttft_ratio", "bytes_per_token_mb",
                                            "bandwidth_share"])
        console.note(f"decode after a short prompt, {max_tokens or 128} tokens; TTFT of a "
                     f"{len(long_prompt)}-token prompt; ratios: pagedchat over the engine"
                     + (f" (medians of {rounds} rounds, engines in turn)" if rounds > 1 else ""))
        if "llama.cpp" in peers:
            extra["llama.cpp"] = {**peers["llama.cpp"].build(),
                                  "tokens": check_tokens(engine, peers["llama.cpp"])}
        if loads:
            extra["load"] = load_times(model)
            report.emit_table("load", [extra["load"]], ["first_load_s", "cached_load_s"])
        report.save(json_path, engine, figures, **extra)
