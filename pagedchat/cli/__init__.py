"""The `pagedchat` command: one Typer app, each command a thin shell in a module of its own.

Adding a command is one module here plus one registration line below.
"""

from __future__ import annotations

import gc

import typer

from pagedchat import console, progress
from pagedchat.cli import batch, bench, chat, inspect, models, run, serve

app = typer.Typer(
    help="A terminal chatbot on a from-scratch PagedAttention engine.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _show_first_start(ctx: typer.Context) -> None:
    # converting a model and compiling the kernels, once, show a progress line on stderr
    # (the chat app shows its own loading screen)
    if ctx.invoked_subcommand != "chat":
        ctx.with_resource(progress.reporting(console.progress))


app.command()(chat.chat)
app.command()(batch.batch)
app.command()(inspect.inspect)
app.command()(models.models)
app.command()(run.run)
app.command()(serve.serve)
app.add_typer(bench.app, name="bench")


def main() -> None:
    """The installed command: ``app`` with what importing it made (torch, typer, rich and
    pagedchat, all alive for the whole process) set outside the garbage collector's reach
    first, so that a full collection walks only the objects made since and a streaming
    answer shows no collector pause. Here and not in the library: frozen objects that later
    became cyclic garbage would never be collected, so a long-lived caller (a test session)
    keeps its collector."""
    gc.freeze()
    app()


if __name__ == "__main__":
    main()
