"""The command answers at once: importing it loads neither torch nor the bench's code
(each command loads what it needs when it runs)."""

from __future__ import annotations

import json
import subprocess
import sys

# the light modules the command line may load up front: console output, the bench
# defaults its --help shows, the engine's config and errors, the named-model table
ALLOWED = {"pagedchat.bench", "pagedchat.bench.report", "pagedchat.bench.serve_defaults"}


def test_importing_the_cli_loads_no_torch_and_no_bench_code():
    code = ("import json, sys, pagedchat.cli; print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'transformers', 'numpy', 'pagedchat'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                       text=True, check=True).stdout)
    assert not [m for m in loaded if m.split(".")[0] in ("torch", "transformers", "numpy")]
    bench = {m for m in loaded if m.startswith("pagedchat.bench")}
    assert bench <= ALLOWED, bench - ALLOWED
    engine = {m for m in loaded if m.startswith("pagedchat.engine.")}
    assert "pagedchat.engine.llm_engine" not in engine and "pagedchat.kernels" not in loaded
