"""The command answers at once: importing it, every command's `--help` and a usage error load
no torch, and none but `bench` loads the lab (each command loads what it needs when it
runs). Help and usage errors are click's plain text: rich, and the markdown parser and
pydantic that typer's rich help brings, load only when a command runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from pagedchat.cli import options as opt

HEAVY = ("torch", "transformers", "numpy")
RICH_HELP = ("rich", "markdown_it", "pydantic")
# every command's --help and a usage error in one process, then the modules they loaded
_HELP_ALL = """
import json, sys, typer.main
from pagedchat.cli import app
paths = [[name] for name in typer.main.get_command(app).commands if name != "bench"]
if %r:  # the bench's --help and each bench's, which load the lab
    from pagedchat_lab.cli import app as lab
    paths = [["bench"], *(["bench", name] for name in typer.main.get_command(lab).commands)]
for args in [["--help"], *([*path, "--help"] for path in paths), ["run", "--no-such-option"]]:
    try:
        app(args)
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in sys.modules
                        if m.split(".")[0] in (*%r, "pagedchat", "pagedchat_lab"))))
"""


def _loaded(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check(loaded: list[str], unwanted: tuple[str, ...] = HEAVY) -> None:
    assert not [m for m in loaded if m.split(".")[0] in unwanted]
    assert "pagedchat.engine.llm_engine" not in loaded and "pagedchat.kernels" not in loaded


def test_importing_the_cli_loads_no_torch_and_no_lab():
    loaded = _loaded("import json, sys, pagedchat.cli; print(json.dumps(sorted(m for m in "
                     f"sys.modules if m.split('.')[0] in (*{HEAVY!r}, 'pagedchat', "
                     "'pagedchat_lab'))))")
    _check(loaded)
    assert "pagedchat.cli" in loaded and not [m for m in loaded if m.startswith("pagedchat_lab")]


def test_every_commands_help_loads_no_torch_and_no_lab():
    loaded = _loaded(_HELP_ALL % (False, HEAVY + RICH_HELP))
    assert "pagedchat.cli.run" in loaded  # the commands' own --help did run
    _check(loaded, HEAVY + RICH_HELP)
    assert not [m for m in loaded if m.startswith("pagedchat_lab")]


def test_every_bench_help_loads_no_torch():
    loaded = _loaded(_HELP_ALL % (True, HEAVY + RICH_HELP))
    assert "pagedchat_lab.cli.throughput" in loaded  # the bench's own --help did run
    _check(loaded, HEAVY + RICH_HELP)


def test_a_ctrl_c_while_starting_lets_the_imports_end_then_stops_the_command():
    """An interrupt inside an import can leave a module half made or be swallowed by a bare
    ``except``: while a command starts it is held, then raised once the block ends."""
    before = signal.getsignal(signal.SIGINT)
    went_on = []
    with pytest.raises(KeyboardInterrupt):
        with opt.starting():
            os.kill(os.getpid(), signal.SIGINT)
            went_on.append("the imports went on")
    assert went_on == ["the imports went on"]
    assert signal.getsignal(signal.SIGINT) is before
    with opt.starting():  # no interrupt: nothing raised
        pass
