"""A pool sized for one request (what `pagedchat run` makes): every block the request can
hold, counted as the scheduler counts it, capped by the context, with a floor."""

from __future__ import annotations

import pytest

from pagedchat.engine.config import EngineConfig
from pagedchat.engine.errors import RequestError


def test_pool_holds_prompt_and_answer_in_whole_blocks():
    config = EngineConfig(block_size=16, max_model_len=8192)
    # 40 + 500 tokens: 33.75 blocks, rounded up
    assert config.request_kv_blocks(40, 500) == 34
    # each sequence counted unshared (n, best_of, the beam width)
    assert config.request_kv_blocks(40, 500, sequences=4) == 4 * 34


def test_pool_is_capped_by_the_context_and_floored():
    config = EngineConfig(block_size=16, max_model_len=1024)
    assert config.request_kv_blocks(100, 100_000) == 1024 // 16
    floor = EngineConfig.MIN_REQUEST_POOL_TOKENS // 16
    assert config.request_kv_blocks(10, 5) == floor
    assert EngineConfig(block_size=256, max_model_len=1024).request_kv_blocks(10, 5) == 1


def test_pool_fits_what_the_scheduler_admits(tiny_model_dir):
    """The scheduler admits the request into a pool of exactly this size, and not into
    one block less."""
    from pagedchat import LLM, SamplingParams
    from pagedchat.engine.errors import RequestError

    params = SamplingParams(max_tokens=400, n=2)
    prompt = list(range(5, 105))
    probe = EngineConfig(block_size=16, max_model_len=1024)
    blocks = probe.request_kv_blocks(len(prompt), params.max_tokens, params.best_of)
    assert blocks > EngineConfig.MIN_REQUEST_POOL_TOKENS // 16
    LLM(model=str(tiny_model_dir), num_kv_blocks=blocks).engine.add_request("a", prompt, params)
    smaller = LLM(model=str(tiny_model_dir), num_kv_blocks=blocks - 1).engine
    with pytest.raises(RequestError, match="needs up to"):
        smaller.add_request("a", prompt, params)


@pytest.mark.parametrize("memory", ["0", "0GiB", 0, "100000TiB"])
def test_a_kv_pool_of_nothing_or_of_more_than_the_machine_is_refused_by_name(memory):
    with pytest.raises(RequestError, match="kv_cache_memory .* must be above 0 and at most "
                                           "this machine's memory"):
        EngineConfig(kv_cache_memory=memory)
    assert EngineConfig(kv_cache_memory="64MiB").kv_cache_memory == "64MiB"
