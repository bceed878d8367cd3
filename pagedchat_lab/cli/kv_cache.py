"""`pagedchat bench kv-cache`: an int8 KV cache against K/V in the model's dtype, in one
run: KV bytes per token, single-stream decode at a long context, and the sequences a fixed
pool runs before its first preemption (ratios; agreement is `bench quality
--kv-cache-dtype int8`)."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli.options import KvMemory, user_errors
from pagedchat_lab.cli import options as opt


def kv_cache(model: opt.Model = None, dtype: opt.DTypeOption = opt.DType.float32,
             weights: opt.Weights = None, kv_memory: KvMemory = "256MiB",
             context: Annotated[int, typer.Option(
                 "--context", min=1, help="Context of the decode timing, in tokens.")] = 4000,
             rounds: Annotated[int, typer.Option(
                 "--rounds", min=1, help="Turns of decode steps each engine takes.")] = 6,
             steps: Annotated[int, typer.Option(
                 "--steps", min=1, help="Decode steps per turn.")] = 8,
             prompt_len: Annotated[int, typer.Option(
                 "--prompt-len", min=1, help="Prompt tokens of each preemption request.")]
             = 256,
             json_path: opt.JsonPath = None) -> None:
    """int8 K/V against the model's dtype, in the same pool of --kv-memory bytes."""
    from pagedchat_lab import report
    from pagedchat_lab.kv_cache import bytes_per_token, decode_seconds, running_before_preemption

    with user_errors():
        base = opt.engine_options(model, dtype, kv_memory=kv_memory, weights=weights)
        engines = [base.build(), base.with_(kv_cache_dtype="int8").build()]
        seconds = decode_seconds(engines, context, rounds, steps)
        rows = []
        for engine, spent in zip(engines, seconds, strict=True):
            rows.append({
                "kv_dtype": engine.kv_cache_dtype, "kv_blocks": engine.config.num_kv_blocks,
                "kv_bytes_per_token": bytes_per_token(engine),
                f"decode_ms_at_{context}": spent * 1000,
                "running_before_preemption": running_before_preemption(
                    engine, prompt_len, 4 * prompt_len, 4 * engine.config.max_num_seqs)})
        plain, int8 = rows
        ratios = {"bytes_per_token_vs_plain": int8["kv_bytes_per_token"]
                  / plain["kv_bytes_per_token"],
                  "decode_speed_vs_plain": seconds[0] / seconds[1],
                  "running_before_preemption_vs_plain": int8["running_before_preemption"]
                  / max(plain["running_before_preemption"], 1)}
        report.emit_table("kv cache", rows, list(rows[0]))
        report.emit_table("int8 against " + plain["kv_dtype"], [ratios], list(ratios))
        console.note(f"decode: one sequence at {context} tokens, the engines taking turns of "
                     f"{steps} steps ({rounds} each), medians; preemption: requests of "
                     f"{prompt_len} prompt tokens in a pool of {kv_memory}, the scheduler and "
                     "block manager alone (no forward pass)")
        report.save(json_path, engines[0], {"pagedchat": {"rows": rows, "ratios": ratios}})
