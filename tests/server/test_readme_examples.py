"""The README's server examples, run as written against `pagedchat serve` on the default
model (only the port is the test's own)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import free_port, wait_until_healthy

README = Path(__file__).parents[2] / "README.md"
pytestmark = pytest.mark.slow


def readme_block(language: str, containing: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.DOTALL)
    [block] = [b for b in blocks if containing in b]
    return block


@pytest.fixture(scope="module")
def default_server() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pagedchat.cli", "serve", "--port", str(port),
                             "--kv-memory", "64MiB"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"127.0.0.1:{port}"
    # a fresh machine converts the GGUF and compiles the kernels first
    wait_until_healthy(proc, f"http://{url}", 600)
    yield url
    proc.terminate()
    assert proc.wait(timeout=60) == 0


def test_the_curl_example_streams_an_answer(default_server):
    block = readme_block("bash", "pagedchat serve --port 8000")
    curl = block[block.index("curl "):].replace("\\\n", " ").strip()
    assert "localhost:8000" in curl
    result = subprocess.run(["bash", "-c", curl.replace("localhost:8000", default_server)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [line[6:] for line in result.stdout.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", result.stdout
    chunks = [json.loads(line) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text.strip() and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_openai_sdk_example_prints_an_answer(default_server):
    code = readme_block("python", "from openai import OpenAI")
    assert "http://localhost:8000/v1" in code
    result = subprocess.run([sys.executable, "-c", code.replace("localhost:8000", default_server)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
