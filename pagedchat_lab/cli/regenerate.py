"""`pagedchat bench regenerate`: a reply regenerated on a long conversation, its prompt
found in the prefix cache (time to first token against a decode step)."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli.options import KvMemory, user_errors
from pagedchat_lab.cli import options as opt


def regenerate(model: opt.Model = None, dtype: opt.DTypeOption = opt.DType.float32,
               weights: opt.Weights = None, kv_memory: KvMemory = "512MiB",
               context: Annotated[int, typer.Option(
                   "--context", min=32, help="Tokens of the conversation.")] = 2000,
               reply_tokens: Annotated[int, typer.Option(
                   "--reply-tokens", min=2, help="Tokens of the reply regenerated.")] = 64,
               rounds: Annotated[int, typer.Option("--rounds", min=1)] = 3,
               json_path: opt.JsonPath = None) -> None:
    """Regenerate on a long conversation: prompt tokens recomputed, first token vs a step."""
    from pagedchat_lab import report, sharegpt
    from pagedchat_lab.regenerate import regenerate as measure

    with user_errors():
        engine = opt.engine_options(model, dtype, kv_memory=kv_memory, weights=weights).build()
        conversation = sharegpt.long_prompt(engine.tokenizer, context)
        figures = measure(engine, conversation, reply_tokens, rounds)
        report.emit_table("regenerate", [figures], list(figures))
        console.note(f"each round: the conversation answered from an empty cache, then the "
                     f"answer regenerated (another seed); the step is the median gap between "
                     f"the first reply's tokens; medians of {rounds} rounds")
        report.save(json_path, engine, {"pagedchat": figures})
