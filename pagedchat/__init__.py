"""pagedchat: a terminal chatbot on a from-scratch PagedAttention engine.

``LLM`` and ``SamplingParams`` load on first use, so that importing a submodule (the
app, the CLI) does not pay for torch and transformers before anything is on screen."""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pagedchat.machine import usable_cores

# MKL's own allocator keeps every buffer it ever packed a matrix into; without it they go back to
# malloc, which the engine keeps warm anyway (runner.memory.keep_freed_memory). MKL reads this once,
# when torch loads it: here it comes before any of pagedchat imports torch. A user's setting wins.
os.environ.setdefault("MKL_DISABLE_FAST_MM", "1")
# torch's oneDNN glue (ideep) keeps one set-up product per shape it sees; the engine's row
# count changes from step to step, and those entries, spread through the heap, keep freed
# activations from being reused. oneDNN's own cache of compiled kernels stays.
os.environ.setdefault("LRU_CACHE_CAPACITY", "1")
# On a machine already busy when pagedchat starts, OpenMP threads wait for work asleep: a
# spinning thread burns the time slices its partner needs, and every parallel step waits for
# the slowest thread. On idle cores spinning answers sooner. The runtime reads this once,
# when it loads (with torch).
RUN_QUEUE = "/proc/loadavg"  # its fourth field: the threads runnable now, this one included


def _machine_is_busy() -> bool:
    """Whether other threads are runnable on every core this process may use as it starts:
    the fewest in three looks at the run queue, 5 ms apart (the last minute's load average
    also counts a run just ended, as a benchmark's last round); without one, that average."""
    try:
        looks = []
        for _ in range(3):
            looks.append(int(Path(RUN_QUEUE).read_text().split()[3].split("/")[0]) - 1)
            time.sleep(0.005)
        return min(looks) >= usable_cores()
    except (OSError, IndexError, ValueError):
        return hasattr(os, "getloadavg") and os.getloadavg()[0] >= usable_cores()


if _machine_is_busy():
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if TYPE_CHECKING:
    from pagedchat.engine.llm import LLM
    from pagedchat.engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str):
    modules = {"LLM": "pagedchat.engine.llm", "SamplingParams": "pagedchat.engine.sampling_params"}
    if name not in modules:
        raise AttributeError(f"module 'pagedchat' has no attribute {name!r}")
    return getattr(importlib.import_module(modules[name]), name)
