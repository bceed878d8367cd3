"""The `pagedchat` command: one Typer app, each command a thin shell in a module of its own.

Adding a command is one module here plus one registration line below."""

from __future__ import annotations

import gc

import typer

from pagedchat import console, progress
from pagedchat.cli import batch, chat, inspect, models, run, serve
from pagedchat.cli import options as opt

app = opt.command_group("A terminal chatbot on a from-scratch PagedAttention engine.")


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


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             add_help_option=False)
def bench(ctx: typer.Context) -> None:
    """The paper's evaluation on this machine, peers side by side."""
    # the lab (pagedchat_lab) is a package of its own, loaded only when a bench runs
    import typer.main

    from pagedchat_lab.cli import app as lab

    group = typer.main.get_command(lab)
    with group.make_context(ctx.info_name, list(ctx.args), parent=ctx.parent) as lab_ctx:
        group.invoke(lab_ctx)


def main() -> None:
    """The installed command: ``app``, with what importing it made (alive for the whole process)
    frozen out of the collector's reach, so that a streaming answer shows no collector pause. Not in
    the library: a long-lived caller (a test session) keeps its collector."""
    gc.freeze()
    app()


if __name__ == "__main__":
    main()
