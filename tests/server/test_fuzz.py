"""Property: every request drawn from the server's own OpenAPI schema, valid or not, gets
a 2xx, or a 4xx in OpenAI's error shape; never a 5xx, never a hang; and afterwards the
engine still answers and holds no blocks.

Requests are drawn by schemathesis (on hypothesis) from /openapi.json, for every route,
half of them made to break the schema. The suite draws 200; a longer run is
``PAGEDCHAT_FUZZ_EXAMPLES=50000 python -m pytest tests/server/test_fuzz.py``.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Iterator

import httpx
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from tests.server.conftest import LiveServer, serving
from tests.server.test_robustness import healthy_after

EXAMPLES = int(os.environ.get("PAGEDCHAT_FUZZ_EXAMPLES", "200"))
# short answers keep each request quick: a 96-token context, 8 sequences
ENGINE = {"max_model_len": 96, "max_num_seqs": 8, "num_kv_blocks": 64}


@pytest.fixture(scope="module")
def fuzzed_server(tiny_model_dir) -> Iterator[LiveServer]:
    with serving(tiny_model_dir, **ENGINE) as live:
        yield live


@pytest.fixture(scope="module")
def requests(fuzzed_server) -> st.SearchStrategy:
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{fuzzed_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions",
                                               "/tokenize", "/detokenize", "/health"}
    return st.one_of([op.as_strategy(generation_mode=mode) for op in operations
                      for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)])


def test_no_request_gets_a_5xx_or_hangs(fuzzed_server, requests):
    statuses: Counter = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=requests)
    def one_request(case) -> None:
        try:
            response = case.call(base_url=fuzzed_server.url, timeout=60)
        except Exception as error:  # a hang (no answer in 60 s) or a dropped connection
            raise AssertionError(f"{case.method} {case.path} {case.body!r}: {error}") from error
        statuses[response.status_code] += 1
        assert response.status_code < 500, (case.method, case.path, case.body, response.text)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, response.text
            assert error["message"], response.text

    one_request()
    assert sum(statuses.values()) >= min(EXAMPLES, 2000) * 0.9
    assert statuses[200] > 0 and any(400 <= s < 500 for s in statuses), statuses
    healthy_after(fuzzed_server.url)
    stats = asyncio.run(fuzzed_server.state.engine_loop.stats())
    assert stats.num_running == stats.num_waiting == 0
    assert stats.used_blocks == 0
    assert httpx.get(f"{fuzzed_server.url}/health", timeout=5).status_code == 200
