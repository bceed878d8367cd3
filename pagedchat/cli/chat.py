"""`pagedchat chat`: the Textual chat app, its options checked before it starts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagedchat.chat.prompt import DEFAULT_CONTEXT_WINDOW
from pagedchat.cli.options import MODEL_HELP, Weights
from pagedchat.tui.main import DEFAULT_KV_BLOCKS, run_chat


def chat(
    model: Annotated[str | None, typer.Option("--model", "-m", help=MODEL_HELP)] = None,
    db: Annotated[Path | None, typer.Option(
        help="SQLite file of the sessions (default: chats.db in $PAGEDCHAT_DATA_DIR, "
             "else in $XDG_DATA_HOME/pagedchat).")] = None,
    continue_last: Annotated[bool, typer.Option(
        "--continue", "-c", help="Reopen the last session.")] = False,
    session: Annotated[int | None, typer.Option(help="Reopen the session with this id.")] = None,
    context_window: Annotated[int, typer.Option(
        min=16, help="Prompt tokens kept: system prompt plus the newest messages that fit."
    )] = DEFAULT_CONTEXT_WINDOW,
    kv_blocks: Annotated[int, typer.Option(
        min=1, help="Blocks in the KV cache pool.")] = DEFAULT_KV_BLOCKS,
    tensor_parallel_size: Annotated[int, typer.Option(
        "--tensor-parallel-size", "-tp", min=1,
        help="Workers that split the model's heads (one process each).")] = 1,
    weights: Weights = None,
    raw: Annotated[bool, typer.Option(
        "--raw", help="Plain continuation: the model continues your text, no chat format."
    )] = False,
) -> None:
    """Chat in the terminal with a model served by the paged engine."""
    run_chat(model, db, continue_last, session, context_window, kv_blocks, tensor_parallel_size,
             weights, raw)
