"""`pagedchat inspect`: the KV block pool, block tables and sharing after every step."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli import options as opt
from pagedchat.engine.presets import PRESETS, SPECULATIVE_TOKENS, swap_space

INSPECT = PRESETS["inspect"]


class Preemption(str, Enum):
    recompute = "recompute"
    swap = "swap"


def inspect(
    prompt: Annotated[list[str] | None, typer.Option(
        "--prompt", help="Run this prompt instead of the default scenario (repeatable).")]
    = None,
    file: Annotated[Path | None, typer.Option("--file", help="Prompts to run, one a line.")] = None,
    step: Annotated[bool, typer.Option("--step", help="Wait for Enter between steps "
                                                      "(q + Enter quits).")] = False,
    json_path: opt.JsonPath = None,
    kv_blocks: Annotated[int, typer.Option("--kv-blocks", min=1, help="KV pool size in blocks.")]
    = INSPECT.num_kv_blocks,
    block_size: opt.BlockSize = 16,
    preemption_mode: Annotated[Preemption, typer.Option(
        "--preemption", help="What a full pool does to the newest request.")]
    = Preemption.recompute,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1,
                                            help="Tokens to generate per request.")]
    = INSPECT.max_tokens,
    max_steps: Annotated[int, typer.Option("--max-steps", min=1)] = 500, model: opt.Model = None,
    weights: opt.Weights = None, kv_cache_dtype: opt.KvCacheDtype = "auto",
    speculative: opt.Speculative = None,
    num_speculative_tokens: opt.NumSpeculativeTokens = SPECULATIVE_TOKENS) -> None:
    """Watch the KV block pool, block tables and sharing, one engine step at a time."""
    with opt.starting():
        from pagedchat.chat.inspect import default_scenario, prompt_scenario, run_scenario
        from pagedchat.cli import inspect_render
        from pagedchat.engine.config import EngineConfig
        from pagedchat.engine.llm_engine import LLMEngine

    with opt.user_errors():
        prompts = list(prompt or [])
        if file is not None:
            if not file.is_file():
                raise FileNotFoundError(f"{file}: " + ("a folder, not a file of prompts"
                                        if file.is_dir() else "no such file"))
            try:
                lines = file.read_text(encoding="utf-8").splitlines()
            except UnicodeDecodeError as error:
                raise ValueError(f"{file}: not UTF-8 text ({error.reason} at byte "
                                 f"{error.start})") from None
            if not (prompts := prompts + [t for t in lines if t.strip()]):
                raise ValueError(f"{file}: no prompts in it (one a line)")
        mode = Preemption(preemption_mode).value
        engine = LLMEngine(EngineConfig(
            model=model, block_size=block_size, num_kv_blocks=kv_blocks,
            max_num_seqs=INSPECT.max_num_seqs, preemption_mode=mode, swap_space=swap_space(mode),
            weights=weights, kv_cache_dtype=kv_cache_dtype, speculative=speculative,
            num_speculative_tokens=num_speculative_tokens))
        arrivals = (prompt_scenario(prompts, max_tokens) if prompts
                    else default_scenario(engine.tokenizer, max_tokens))

        def show(snapshot) -> bool:
            title = f"step {snapshot.step}" + "".join(f" | {e}" for e in snapshot.events)
            console.stdout.print(inspect_render.snapshot(title, snapshot.stats))
            return not step or sys.stdin.readline().strip().lower() != "q"

        snapshots = run_scenario(engine, arrivals, show, max_steps)
        if json_path:
            json_path.write_text(json.dumps({"metadata": console.engine_metadata(engine),
                                             "snapshots": [s.to_json() for s in snapshots]},
                                            indent=1) + "\n")
            console.note(f"{len(snapshots)} snapshots written to {json_path}")
        if all(f"{a.request_id} refused: " in " ".join(e for s in snapshots for e in s.events)
               for a in arrivals):
            raise ValueError("every request was refused (each step above says why)")
