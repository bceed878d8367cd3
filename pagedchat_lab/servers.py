"""A server under test as a child process: started on a loopback port the OS hands out,
ready once it lists its models, stopped with SIGTERM, and killed with its whole process
group when it does not stop in time."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from pagedchat_lab.suite import EngineOptions

HOST = "127.0.0.1"
# settings the servers read from the environment that would move them to another port or
# lock them behind a key the bench does not send
_MOVING_ENV = ("HOST", "PORT", "API_KEY", "CONFIG_FILE", "PAGEDCHAT_API_KEY")
LLAMA_SERVER_MODULES = ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings")
LLAMA_SERVER_INSTALL = ("pip install 'pagedchat[peers]' (llama-cpp-python and what its server "
                        "needs: sse-starlette, starlette-context, pydantic-settings)")


def free_port() -> int:
    """A loopback port the OS just handed out (free unless another program takes it
    before the server binds it)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``with ServerProcess(name, command) as server:`` runs ``command(port)`` until the
    block ends; ``server.url`` is its base URL. It is ready once ``ready_path`` answers 200
    (pagedchat's /health, after its warm-up). Its output goes to a temporary file and is
    quoted when it fails to start."""

    def __init__(self, name: str, command: Callable[[int], list[str]],
                 start_timeout: float = 600.0, stop_timeout: float = 60.0,
                 ready_path: str = "/v1/models") -> None:
        self.name = name
        self.ready_path = ready_path
        self.port = free_port()
        self.command = command(self.port)
        self.url = f"http://{HOST}:{self.port}"
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self.process: subprocess.Popen | None = None
        self.log = None

    def __enter__(self) -> ServerProcess:
        self.log = tempfile.TemporaryFile(mode="w+b")
        env = {key: value for key, value in os.environ.items() if key not in _MOVING_ENV}
        # a session of its own: a kill reaches the workers it starts too
        self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=self.log,
                                        stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise ValueError(f"{self.name} exited with code {code} before it answered: "
                                 f"{self.output_tail()}")
            try:
                if httpx.get(f"{self.url}{self.ready_path}", timeout=10).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise ValueError(f"{self.name} did not answer on {self.url} within "
                                 f"{self.start_timeout:g} s: {self.output_tail()}")
            time.sleep(0.2)

    def output_tail(self, chars: int = 2000) -> str:
        """The end of what the server printed."""
        if self.log is None or self.log.closed:
            return ""
        # pread leaves alone the file offset the server shares and writes at
        fd = self.log.fileno()
        tail = os.pread(fd, chars, max(0, os.fstat(fd).st_size - chars))
        return tail.decode(errors="replace").strip() or "(it printed nothing)"

    def stop(self) -> int | None:
        """SIGTERM, then wait; SIGKILL to its process group after ``stop_timeout``. Returns
        its exit code (None if it never started)."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):  # it ended in between
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if self.log is not None:
            self.log.close()
        return process.returncode


def pagedchat_command(options: EngineOptions, port: int) -> list[str]:
    """``pagedchat serve`` with the engine a bench builds from ``options``."""
    command = [sys.executable, "-m", "pagedchat.cli", "serve", "--host", HOST, "--port",
               str(port), "--block-size", str(options.block_size), "--max-num-seqs",
               str(options.max_num_seqs), "--max-num-batched-tokens",
               str(options.max_num_batched_tokens), "--dtype", options.dtype,
               "--tensor-parallel-size", str(options.tensor_parallel_size),
               "--log-level", "warning"]
    for flag, value in (("--model", options.model), ("--kv-blocks", options.num_kv_blocks),
                        ("--kv-memory", options.kv_cache_memory),
                        ("--weights", options.weights)):
        if value is not None:
            command += [flag, str(value)]
    return command


def llama_server_command(gguf: Path, threads: int, context: int, port: int) -> list[str]:
    """llama-cpp-python's server on ``gguf`` with ``threads`` threads and a context of
    ``context`` tokens. It serves one request at a time; a new request must wait, not
    interrupt the one streaming (its default is to interrupt)."""
    missing = [name for name in LLAMA_SERVER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"llama-server needs {', '.join(missing)}: {LLAMA_SERVER_INSTALL}")
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", HOST,
            "--port", str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads),
            "--n_ctx", str(context), "--n_gpu_layers", "0", "--interrupt_requests", "false",
            "--verbose", "false"]
