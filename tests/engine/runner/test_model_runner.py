"""The model runner's step: logits written into one buffer kept across steps."""

from __future__ import annotations

import ctypes
import mmap
import sys

import pytest

from pagedchat import LLM, SamplingParams
from tests.engine.test_llm_engine import GREEDY, _prompts


def test_logits_go_to_one_buffer_kept_across_steps(tiny_model_dir):
    """A step's logits are written into rows of a buffer the runner keeps (grown to the next
    power of two of rows), not a new allocation per step; outputs stay the reference's."""
    llm = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16)
    runner = llm.engine.runner
    seen = []
    buffer = runner._logits_buffer

    def recording(rows):
        logits = buffer(rows)
        seen.append((logits.shape[0], logits.untyped_storage().data_ptr()))
        return logits

    runner._logits_buffer = recording
    prompts = _prompts(5, seed=11)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert {rows for rows, _ in seen} >= {5}
    assert len({pointer for rows, pointer in seen if rows > 4}) == 1
    assert runner._logits.shape[0] == 8
    reference = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16,
                    attention_backend="torch")
    assert ours == [o.outputs[0].token_ids for o in reference.generate(prompts, GREEDY)]


def test_the_kernels_get_the_steps_largest_query_and_context(tiny_model_dir, monkeypatch):
    """AttentionMetadata's host-side maxima reach the attention kernel (the Triton backend
    sizes its launch by them instead of reading the lengths back from the device)."""
    from pagedchat.kernels import reference

    seen = []
    attention = reference.paged_attention

    def recording(*args, **hints):
        seen.append((hints["max_query_len"], hints["max_context_len"]))
        return attention(*args, **hints)

    monkeypatch.setattr(reference, "paged_attention", recording)
    llm = LLM(model=str(tiny_model_dir), num_kv_blocks=64, attention_backend="torch")
    prompts = _prompts(2, seed=3)
    llm.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    longest = max(map(len, prompts))
    layers = llm.engine.model_config.num_hidden_layers
    assert seen == [(longest, longest)] * layers + [(1, longest + 1)] * layers


def _resident_bytes(tensor) -> int:
    """Bytes of ``tensor``'s storage in memory now (Linux ``mincore``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    start, size = tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    present = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(size), present) == 0
    return sum(flag & 1 for flag in present) * mmap.PAGESIZE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore: Linux")
def test_a_cpu_pool_comes_into_memory_as_its_blocks_are_written(tiny_model_dir):
    """Building an engine touches none of its CPU KV pool (the system's zero pages), so a
    start costs nothing per block; a request's blocks come in when first written, and its
    tokens are the reference's."""
    llm = LLM(model=str(tiny_model_dir), kv_cache_memory="64MiB", block_size=16)
    pool = llm.engine.runner.k_caches[0]
    assert pool.untyped_storage().nbytes() >= 32 << 20
    assert _resident_bytes(pool) == 0
    prompts = _prompts(2, seed=5)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert 0 < _resident_bytes(pool) < pool.untyped_storage().nbytes()
    reference = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16,
                    attention_backend="torch")
    assert ours == [o.outputs[0].token_ids for o in reference.generate(prompts, GREEDY)]
