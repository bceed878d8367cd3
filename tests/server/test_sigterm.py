"""SIGTERM during a stream: the stream ends cleanly, the process exits with 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pytest


@pytest.fixture
def server_process(tiny_model_dir, unused_port):
    port = unused_port
    proc = subprocess.Popen(
        [sys.executable, "-c", "from pagedchat.cli import main; main()", "serve",
         "--model", str(tiny_model_dir), "--port", str(port), "--kv-blocks", "256",
         "--drain-timeout", "1", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the server exited: {proc.stdout.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the server did not start")
        time.sleep(0.2)
    yield proc, url
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_sigterm_during_a_stream_ends_it_and_exits_zero(server_process):
    proc, url = server_process
    body = {"prompt": "Count:", "max_tokens": 5000, "temperature": 0, "ignore_eos": True,
            "stream": True}
    chunks, reasons, done = 0, [], False
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as reply:
        for line in reply.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks += 1
                if chunks == 2:
                    proc.send_signal(signal.SIGTERM)
                reasons += [c["finish_reason"] for c in json.loads(line[6:])["choices"]]
    assert done and reasons[-1] in ("abort", "length")
    assert proc.wait(timeout=60) == 0
    with pytest.raises(httpx.TransportError):  # nothing listens any more
        httpx.get(f"{url}/health", timeout=2)
