"""`pagedchat batch`: a JSONL file of prompts through the engine, resumable."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli import options as opt
from pagedchat.engine.presets import PRESETS, swap_space

BATCH = PRESETS["batch"]


def batch(
    input_path: Annotated[str, typer.Argument(metavar="IN", help="JSONL requests; - = stdin.")],
    output: Annotated[str, typer.Option("-o", "--output", metavar="OUT",
                                        help="JSONL results, appended; - = stdout.")] = "-",
    model: opt.Model = None,
    system: Annotated[str | None, typer.Option(
        "--system", help="A system prompt shared by every line (its KV blocks are shared).")]
    = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1,
                                            help="Default max_tokens of a line.")]
    = BATCH.max_tokens,
    temperature: Annotated[float | None, typer.Option(
        "--temperature", min=0.0,
        help="Default temperature of a line (0 = greedy; unset: 1.0, as vLLM).")] = None,
    kv_blocks: opt.KvBlocks = None, kv_memory: opt.KvMemory = None, tp: opt.TensorParallelSize = 1,
    weights: opt.Weights = None, kv_cache_dtype: opt.KvCacheDtype = "auto") -> None:
    """Run a JSONL file of prompts through the engine; resumable (a rerun skips answered lines)."""
    with opt.starting():
        from pagedchat.chat.batch import describe, load_done, run_batch
        from pagedchat.engine.config import EngineConfig
        from pagedchat.engine.llm_engine import LLMEngine
        from pagedchat.engine.sampling_params import SamplingParams

    opt.check_text(system, "--system")
    with opt.user_errors("standard output" if output == "-" else output):
        if input_path != "-" and not Path(input_path).is_file():
            raise FileNotFoundError(f"{input_path}: " + ("a folder, not a file of requests"
                                    if Path(input_path).is_dir() else "no such file"))
        done = load_done(Path(output)) if output != "-" else {}
        raw = sys.stdin.buffer.read() if input_path == "-" else Path(input_path).read_bytes()
        # lines end at \n only (U+2028 may be in a JSON string); bad UTF-8 is its line's error
        text = raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8", errors="surrogateescape")
        lines = text.replace("\r\n", "\n").removesuffix("\n").split("\n") if text else []
        defaults: dict[str, object] = {"max_tokens": max_tokens}
        if temperature is not None:
            defaults["temperature"] = temperature
        SamplingParams(**defaults)  # a bad default ends the run before the model loads
        engine = LLMEngine(EngineConfig(
            model=model, num_kv_blocks=kv_blocks, kv_cache_memory=kv_memory,
            max_num_seqs=BATCH.max_num_seqs, tensor_parallel_size=tp, weights=weights,
            kv_cache_dtype=kv_cache_dtype, swap_space=swap_space("recompute")))
        sink = sys.stdout if output == "-" else open(output, "a", encoding="utf-8")
        try:
            with console.progress("batch", sum(1 for t in lines if t.strip())) as advance:
                summary = run_batch(engine, lines, sink, done, system, defaults,
                                    warn=lambda m: console.note(f"[yellow]{m}[/yellow]"),
                                    progress=advance)
        finally:
            if sink is not sys.stdout:
                sink.close()
        console.note(describe(summary))
    raise typer.Exit(summary.exit_code)
