"""SIGTERM during a stream: the stream ends cleanly, the process exits with 0. A broken
engine: the process exits with 1, for its supervisor to restart it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import httpx
import pytest

from tests.server.conftest import wait_until_healthy

# the engine fails at the first step that holds a completion (after the warm-up's steps)
FAULTY_ENGINE = """
import pagedchat.engine.llm_engine as engine
step = engine.LLMEngine.step
def faulty(self):
    if any(g.request_id.startswith("cmpl-") for g in self.scheduler.groups()):
        raise RuntimeError("an injected kernel fault")
    return step(self)
engine.LLMEngine.step = faulty
"""


@pytest.fixture(params=["sound"])
def server_process(request, tiny_model_dir, unused_port):
    port = unused_port
    preamble = FAULTY_ENGINE if request.param == "faulty" else ""
    proc = subprocess.Popen(
        [sys.executable, "-c", preamble + "from pagedchat.cli import main; main()", "serve",
         "--model", str(tiny_model_dir), "--port", str(port), "--kv-blocks", "256",
         "--drain-timeout", "1", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_until_healthy(proc, url, 120)
    yield proc, url
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_sigterm_during_a_stream_ends_it_and_exits_zero(server_process):
    proc, url = server_process
    body = {"prompt": "Count:", "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
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


@pytest.mark.parametrize("server_process", ["faulty"], indirect=True)
def test_a_broken_engine_ends_the_process_with_1_and_says_why(server_process):
    proc, url = server_process
    reply = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 4},
                       timeout=60)
    assert reply.status_code == 503 and "injected kernel fault" in reply.text
    assert proc.wait(timeout=60) == 1
    output = proc.stdout.read()
    assert "the engine failed" in output and "injected kernel fault" in output
