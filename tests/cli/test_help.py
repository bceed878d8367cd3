"""Every command's `--help` shows each option's help text whole, brackets included: when
help went through rich, its markup took any `[word ...]` for a tag and dropped it, and
"[default: X]" or "the [peers] extra" silently vanished from `--help`.
"""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from pagedchat.cli import app
from pagedchat_lab.cli import app as lab

BRACKETED = re.compile(r"\\?\[[^\]]*\]")


def _commands(command, path: tuple[str, ...] = ()):
    if path == ("bench",):  # the lab's group, which `bench` loads when it runs
        command = typer.main.get_command(lab)
    yield path, command
    if hasattr(command, "commands"):  # a group
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


def _bracketed_help() -> list[tuple[tuple[str, ...], str, str]]:
    """(command path, option, text in brackets as the user must read it) for every option
    whose help holds brackets."""
    found = []
    for path, command in _commands(typer.main.get_command(app)):
        for param in command.params:
            for text in BRACKETED.findall(getattr(param, "help", None) or ""):
                found.append((path, param.name, text.removeprefix("\\")))
    return found


def test_options_with_brackets_exist():
    """The check below has something to check (the bench peers' extra at least)."""
    assert any(text == "[peers]" for _, _, text in _bracketed_help())


@pytest.mark.parametrize(("path", "option", "text"), _bracketed_help(),
                         ids=lambda value: "-".join(value) if isinstance(value, tuple)
                         else str(value))
def test_help_keeps_bracketed_text(path, option, text):
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400",
                                                             "TERMINAL_WIDTH": "400"})
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.replace("│", " ").split())
    assert " ".join(text.split()) in shown, f"{' '.join(path)} --{option}: {text!r} not shown"
