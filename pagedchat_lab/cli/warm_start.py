"""`pagedchat bench warm-start`: a long session reopened with its KV blocks read back from
the KV store against its prompt computed again (time to first token, greedy output)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli.options import KvMemory, user_errors
from pagedchat_lab.cli import options as opt


def warm_start(model: opt.Model = None, dtype: opt.DTypeOption = opt.DType.float32,
               weights: opt.Weights = None, kv_memory: KvMemory = "1GiB",
               context: Annotated[int, typer.Option(
                   "--context", min=32, help="Tokens of the session reopened.")] = 4000,
               rounds: Annotated[int, typer.Option(
                   "--rounds", min=1, help="Warm and cold first tokens, taking turns.")] = 3,
               check_tokens: Annotated[int, typer.Option(
                   "--check-tokens", min=1, help="Greedy tokens compared warm vs cold.")]
               = 16,
               kv_store: Annotated[Path | None, typer.Option(
                   help="The store's folder (default: a temporary one).")] = None,
               json_path: opt.JsonPath = None) -> None:
    """Time to first token of a reopened session: KV blocks read from disk vs recomputed."""
    from pagedchat.engine.kv_store import KVStore
    from pagedchat_lab import report, sharegpt
    from pagedchat_lab.warm_start import warm_against_cold

    with user_errors(), tempfile.TemporaryDirectory() as scratch:
        engine = opt.engine_options(model, dtype, kv_memory=kv_memory, weights=weights).build()
        engine.kv_store = KVStore(engine, kv_store or scratch, 4 << 30)
        session = sharegpt.long_prompt(engine.tokenizer, context)
        question = engine.tokenizer.encode("\nIn one sentence, what was this about?")
        figures = warm_against_cold(engine, session, question, rounds, check_tokens)
        report.emit_table("warm start", [figures], list(figures))
        console.note(f"one engine, its pool emptied before each first token; warm reads the "
                    f"session's blocks from the store (the files in the OS page cache), "
                    f"cold computes them; medians of {rounds} rounds taking turns")
        report.save(json_path, engine, {"pagedchat": figures})
