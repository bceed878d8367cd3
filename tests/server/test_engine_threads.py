"""The server's engine is built off the main thread, so that no OpenMP pool of the main
thread outlives the load (libgomp stops spinning at its barriers when it counts more
threads than cores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import os, sys, time
import torch
from pagedchat.engine.config import EngineConfig
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.server.serve import build_engine

def threads():
    return len(os.listdir("/proc/self/task"))

def settled(expected):
    # threads that were told to end leave /proc a moment after they are joined
    deadline = time.monotonic() + 10
    while threads() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return threads()

config = EngineConfig(model=sys.argv[1], num_kv_blocks=64, block_size=16, swap_space="0B")
before = threads()
build_engine(config)
after_build_engine = settled(before)
LLMEngine(config)
print(before, after_build_engine, threads())
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: OpenMP starts no pool")
def test_build_engine_leaves_no_thread_behind(tiny_model_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_dir)],
                          capture_output=True, text=True, timeout=300, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": "2"})
    before, after_build_engine, after_main_thread_load = map(int, done.stdout.split())
    assert after_build_engine == before
    # the same load on the main thread leaves its pool: the count above can move
    assert after_main_thread_load > after_build_engine
