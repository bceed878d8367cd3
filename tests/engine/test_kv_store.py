"""The KV store: a conversation's blocks written when its request ends, read back by an
engine started afresh, with greedy output identical to a cold engine's and its prompt taken
from the cache; a corrupt file, another model's file, or other tokens under the same hash
are misses, never a wrong answer."""

from __future__ import annotations

import json
import logging
import struct

import pytest

from pagedchat.engine.config import EngineConfig
from pagedchat.engine.errors import RequestError
from pagedchat.engine.kv_store import MAGIC, SUFFIX
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
BLOCK = 16


def engine(model, store=None, **options) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model), num_kv_blocks=64, block_size=BLOCK,
                                  kv_store=None if store is None else str(store), **options))


def answer(llm: LLMEngine, prompt: list[int], rid: str = "r"):
    llm.add_request(rid, prompt, GREEDY)
    while llm.has_unfinished_requests():
        for output in llm.step():
            if output.finished:
                return output
    raise AssertionError("the request never finished")


def files(store) -> list:
    return sorted(store.glob(f"*/*{SUFFIX}"))


def rewrite(path, change) -> None:
    """Rewrite the block file ``path`` with ``change(header, payload)``'s result."""
    raw = path.read_bytes()
    (length,) = struct.unpack_from("<I", raw, len(MAGIC))
    start = len(MAGIC) + 4
    header, payload = json.loads(raw[start:start + length]), raw[start + length:]
    header, payload = change(header, payload)
    encoded = json.dumps(header).encode()
    path.write_bytes(MAGIC + struct.pack("<I", len(encoded)) + encoded + payload)


@pytest.fixture
def conversation(tiny_model_dir, tmp_path):
    """A first turn answered by an engine with a store; the next turn's prompt (the first
    turn, its reply, a new question) and the cold engine's answer to it."""
    first = [(i * 37 + 11) % 200 + 3 for i in range(90)]
    store = tmp_path / "kv"
    out = answer(engine(tiny_model_dir, store), first)
    second = first + out.outputs[0].token_ids + [(i * 13 + 5) % 200 + 3 for i in range(9)]
    cold = answer(engine(tiny_model_dir), second)
    assert cold.num_cached_tokens == 0
    return store, second, cold.outputs[0].token_ids


def test_a_restarted_engine_reads_the_blocks_back_and_answers_the_same(tiny_model_dir,
                                                                       conversation):
    store, second, cold = conversation
    saved = files(store)
    # the first turn's 90 + 12 tokens less the last one: 6 full blocks
    assert len(saved) == 6
    warm = engine(tiny_model_dir, store)
    out = answer(warm, second)
    assert out.outputs[0].token_ids == cold
    assert out.num_cached_tokens == 6 * BLOCK  # read from disk, not computed
    assert warm.kv_store.loaded == warm.stats().kv_store_read == 6
    assert engine(tiny_model_dir).stats().kv_store_read is None  # no store
    assert len(files(store)) == len(second + cold[:-1]) // BLOCK  # this turn's blocks too


def test_a_corrupt_file_is_a_miss_logged_and_removed(tiny_model_dir, conversation, caplog):
    store, second, cold = conversation
    third = files(store)[2]  # which block is third in the chain does not matter: a hole
    rewrite(third, lambda header, payload: (header, payload[:-1] + bytes([payload[-1] ^ 1])))
    with caplog.at_level(logging.WARNING, logger="pagedchat.engine.kv_store"):
        out = answer(engine(tiny_model_dir, store), second)
    assert out.outputs[0].token_ids == cold
    assert out.num_cached_tokens < 6 * BLOCK
    assert any("corrupt" in record.message for record in caplog.records)
    # the block was computed again and written anew: a later start finds the whole prompt
    assert answer(engine(tiny_model_dir, store), second).num_cached_tokens == 6 * BLOCK


def test_another_models_files_and_other_tokens_are_misses(tiny_model_dir, conversation,
                                                        caplog):
    store, second, cold = conversation
    folder = files(store)[0].parent
    other = engine(tiny_model_dir, store, dtype="bfloat16")  # another K/V type: another store
    assert other.kv_store.folder != folder
    assert answer(other, second).num_cached_tokens == 0
    for path in folder.iterdir():  # the first engine's files put in the other's folder
        (other.kv_store.folder / path.name).write_bytes(path.read_bytes())
    with caplog.at_level(logging.WARNING, logger="pagedchat.engine.kv_store"):
        other = engine(tiny_model_dir, store, dtype="bfloat16")
        assert answer(other, second, "again").num_cached_tokens == 0
    assert any("another model" in record.message for record in caplog.records)

    for path in folder.iterdir():  # every block claims other tokens under its hash
        rewrite(path, lambda header, payload: (
            {**header, "tokens": [t + 1 for t in header["tokens"]]}, payload))
    out = answer(engine(tiny_model_dir, store), second)
    assert out.num_cached_tokens == 0 and out.outputs[0].token_ids == cold


def test_the_store_keeps_under_its_cap_dropping_the_least_recently_used(tiny_model_dir,
                                                                      tmp_path):
    store = tmp_path / "kv"
    llm = engine(tiny_model_dir, store, kv_store_cap=10 * 4096)
    one_block = llm.runner.block_bytes
    llm.kv_store.cap_bytes = 10 * one_block
    for n in range(3):
        answer(llm, [(i * 7 + n) % 200 + 3 for i in range(70)], f"r{n}")
    sizes = sum(path.stat().st_size for path in files(store))
    assert 0 < sizes <= 10 * one_block + 10 * 4096  # the cap, give or take the headers
    assert llm.kv_store.saved > len(files(store))  # some were evicted


def test_options_that_cannot_combine_are_refused(tmp_path):
    with pytest.raises(RequestError, match="tensor parallelism"):
        EngineConfig(kv_store=str(tmp_path), tensor_parallel_size=2)
    with pytest.raises(RequestError, match="prefix cache"):
        EngineConfig(kv_store=str(tmp_path), enable_prefix_caching=False)


def test_a_model_with_sliding_window_layers_wakes_up_warm(tmp_path, tiny_tokenizer):
    from tests.engine.models.test_gemma3 import save_tiny_gemma3

    model = save_tiny_gemma3(tmp_path / "gemma", tiny_tokenizer)
    store = tmp_path / "kv"
    first = [(i * 29 + 7) % 200 + 3 for i in range(80)]
    out = answer(engine(model, store), first)
    second = first + out.outputs[0].token_ids + [(i * 11 + 2) % 200 + 3 for i in range(9)]
    cold = answer(engine(model), second)
    warm = answer(engine(model, store), second)
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    assert warm.num_cached_tokens == (len(first) + 11) // BLOCK * BLOCK


def test_block_manager_hooks_adopt_once_and_keep_found_blocks_last_to_go():
    from pagedchat.engine.block_manager import BlockManager
    from pagedchat.engine.blocks import HOLE, NO_HASH, block_hash

    bm = BlockManager(num_blocks=4, block_size=2)
    tokens = [(1, 2), (3, 4)]
    first = block_hash(NO_HASH, tokens[0])
    second = block_hash(first, tokens[1])
    a = bm.adopt(0, first, NO_HASH, tokens[0])
    b = bm.adopt(0, second, first, tokens[1])
    assert bm.adopt(0, first, NO_HASH, tokens[0]) == HOLE  # its hash is taken already
    assert list(bm.evictable) == [a, b] and bm.blocks[a].ref_count == 0
    assert bm.cached_block(0, first, NO_HASH, tokens[0]) == a
    assert list(bm.evictable) == [b, a]  # found: the last to be evicted
    assert bm.cached_block(0, first, NO_HASH, (9, 9)) == HOLE  # other tokens: a miss
