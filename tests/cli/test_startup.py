"""The command answers at once: importing it, every command's `--help` and a usage error load
neither torch nor the bench's code (each command loads what it needs when it runs)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "numpy")
# every command's --help and a usage error in one process, then the modules they loaded
_HELP_ALL = """
import json, sys, typer.main
from pagedchat.cli import app
group = typer.main.get_command(app)
paths = [[name] for name in group.commands]
paths += [["bench", name] for name in group.commands["bench"].commands]
for args in [["--help"], *([*path, "--help"] for path in paths), ["run", "--no-such-option"]]:
    try:
        app(args)
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in (*%r, "pagedchat"))))
"""


def _loaded(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check(loaded: list[str]) -> None:
    assert not [m for m in loaded if m.split(".")[0] in HEAVY]
    assert not [m for m in loaded if m == "pagedchat.bench" or m.startswith("pagedchat.bench.")]
    assert "pagedchat.engine.llm_engine" not in loaded and "pagedchat.kernels" not in loaded


def test_importing_the_cli_loads_no_torch_and_no_bench_code():
    _check(_loaded("import json, sys, pagedchat.cli; print(json.dumps(sorted(m for m in "
                   f"sys.modules if m.split('.')[0] in (*{HEAVY!r}, 'pagedchat'))))"))


def test_every_commands_help_loads_no_torch_and_no_bench_code():
    loaded = _loaded(_HELP_ALL % (HEAVY,))
    assert "pagedchat.cli.bench.throughput" in loaded  # the bench's own --help did run
    _check(loaded)
