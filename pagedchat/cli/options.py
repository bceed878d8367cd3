"""What the shells share: the options several commands take, and user errors as one line."""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
import typer.core

from pagedchat import console, progress
from pagedchat.engine.errors import PagedChatError, invalid_text


class _Group(typer.core.TyperGroup):
    """A command group whose ``--help`` left out reads False rather than None: typer coerces
    a None through pydantic, whose import would come with every command's ``--help``."""

    def get_help_option(self, ctx: typer.Context) -> typer.core.TyperOption | None:
        if (option := super().get_help_option(ctx)) is not None:
            option.default = False
        return option


def command_group(help: str) -> typer.Typer:
    """A group of commands (``pagedchat``, ``pagedchat bench``) that answers ``--help`` and
    usage errors at once."""
    return typer.Typer(
        cls=_Group, help=help, no_args_is_help=True, pretty_exceptions_enable=False,
        add_completion=False,
        # click's plain help and usage errors: typer's rich ones first import a markdown
        # parser, which alone would spend most of the time a --help may take
        rich_markup_mode=None)


MODEL_HELP = ("HF folder, GGUF file or named model (see pagedchat models); default: "
              "SmolLM2-135M-Instruct.")
Model = Annotated[str | None, typer.Option("--model", "-m", help=MODEL_HELP)]
JsonPath = Annotated[Path | None, typer.Option("--json", help="Write figures + metadata.")]
BlockSize = Annotated[int, typer.Option("--block-size", help="Tokens per KV block.")]
KvBlocks = Annotated[int | None, typer.Option("--kv-blocks", min=1, help="KV pool size in blocks.")]
KvMemory = Annotated[str | None, typer.Option("--kv-memory",
                                              help="KV pool size in bytes, e.g. 1GiB.")]
Weights = Annotated[str | None, typer.Option(
    "--weights", help="gguf: a GGUF's tensors kept quantized (the default for a GGUF on the "
                      "CPU); gguf-int8: the same, multiplied with activations rounded to 8 "
                      "bits, as llama.cpp does (faster, not token-exact); q8_0: an HF "
                      "folder's weights quantized to Q8_0 at load; float32 or bfloat16: "
                      "de-quantized.")]
KvCacheDtype = Annotated[str, typer.Option(
    "--kv-cache-dtype", help="auto: K/V kept in the model's dtype; int8: K/V rounded to 8 bits "
                             "with a scale per token and head (about a quarter of float32's "
                             "bytes, so about 4x the tokens in the same pool; not token-exact). "
                             "Refused where the attention backend lacks it.")]


def _check_speculative(ctx: typer.Context, value: str | None) -> str | None:
    if value not in (None, "ngram"):
        raise typer.BadParameter(f"{value!r} is not a speculation (choose ngram)")
    # alone it would change nothing: refused, not ignored (an absent option comes last)
    source = ctx.get_parameter_source("num_speculative_tokens")
    if value is None and getattr(source, "name", None) == "COMMANDLINE":
        raise typer.BadParameter("it needs --speculative ngram (alone it changes nothing)",
                                 param_hint="'--num-speculative-tokens'")
    return value


Speculative = Annotated[str | None, typer.Option(
    "--speculative", callback=_check_speculative,
    help="ngram: each step, propose the tokens that followed the reply's last few tokens "
         "earlier in the prompt or reply, and verify them in the same step (output "
         "unchanged; faster where replies repeat their context, as code edits do).")]
NumSpeculativeTokens = Annotated[int, typer.Option(
    "--num-speculative-tokens", min=1, max=16, help="Most tokens proposed per step with "
                                                    "--speculative.")]
KvStoreCap = Annotated[str, typer.Option(
    "--kv-store-cap", help="Largest size of the KV store's folder, e.g. 2GiB; the least "
                           "recently used blocks go first.")]
TensorParallelSize = Annotated[int, typer.Option(
    "--tensor-parallel-size", "-tp", min=1,
    help="Workers that split the model's heads (one process each).")]


@contextmanager
def starting() -> Iterator[None]:
    """A spinner while a command imports torch and the engine (seconds before a first
    start's own progress, converting or compiling, can show). A Ctrl+C meanwhile stops the
    command once the imports end: one inside an import can leave a module half made (a
    traceback later) or be swallowed by a library's bare ``except``."""
    held = threading.current_thread() is threading.main_thread()
    interrupted: list[object] = []
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(1)) if held else None
    try:
        with progress.task("starting: loading torch and the engine"):
            yield
    finally:
        if held:
            signal.signal(signal.SIGINT, previous)
    if interrupted:
        raise KeyboardInterrupt


@contextmanager
def user_errors(output: str | None = None) -> Iterator[None]:
    """A problem the user can fix becomes one line on stderr and exit code 1. ``output``: where
    the command writes its results, named when a write finds the disk full (the error does not)."""
    try:
        yield
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as pipes do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing to flush
        raise typer.Exit(141) from None
    except (PagedChatError, ValueError, OSError) as error:
        # OSError covers a missing file as well as a full disk while writing results.
        from rich.markup import escape

        text = str(error)
        if getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) and not error.filename:
            text = f"cannot write {output or 'the results'}: {error.strerror}"
        console.note(f"[red]error:[/red] {escape(text)}")  # no markup in the text
        raise typer.Exit(1) from error


def check_text(text: str | None, param_hint: str) -> None:
    """Refuse (exit 2) shell or pipe bytes that are not UTF-8: no tokenizer encodes them."""
    if problem := invalid_text(text):
        raise typer.BadParameter(problem[1] + ": give UTF-8 text", param_hint=param_hint)
