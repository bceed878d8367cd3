"""A server with speculative decoding: the same answers as without it (greedy, structured
output too), and /metrics says which speculation is in force and counts its tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import LiveServer, serving

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["color", "ok"],
          "properties": {"color": {"enum": ["red", "green", "blue"]},
                         "ok": {"type": "boolean"}}}
BODIES = [
    {"messages": [{"role": "user", "content": "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2"}],
     "max_tokens": 24, "temperature": 0, "ignore_eos": True},
    {"messages": [{"role": "user", "content": "Colour? Say red, red, red."}], "max_tokens": 40,
     "temperature": 0, "response_format": {"type": "json_schema",
                                           "json_schema": {"name": "a", "schema": SCHEMA}}},
]


@pytest.fixture(scope="module")
def speculative_server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with serving(tiny_model_dir, speculative="ngram", num_speculative_tokens=3) as live:
        yield live


def _answers(url: str) -> list[tuple[str, str]]:
    with httpx.Client(base_url=url, timeout=60) as http:
        replies = [http.post("/v1/chat/completions", json=body).json() for body in BODIES]
    return [(r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"])
            for r in replies]


def test_answers_and_metrics_with_speculation(live_server, speculative_server):
    assert _answers(speculative_server.url) == _answers(live_server.url)
    with httpx.Client(base_url=speculative_server.url, timeout=30) as http:
        http.get("/metrics")  # the engine's figures are taken as /metrics is read
    registry = speculative_server.state.metrics.registry
    assert registry.get_sample_value("pagedchat_speculative_decoding", {"method": "ngram"}) == 1
    drafted = registry.get_sample_value("pagedchat_spec_decode_draft_tokens_total")
    accepted = registry.get_sample_value("pagedchat_spec_decode_accepted_tokens_total")
    assert drafted > 0 and 0 <= accepted <= drafted
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        text = http.get("/metrics").text
    assert 'pagedchat_speculative_decoding{method="off"} 1.0' in text

