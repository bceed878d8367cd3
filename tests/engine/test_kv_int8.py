"""The engine on int8 KV caches (``kv_cache_dtype="int8"``): the pool's bytes, agreement
with float32 K/V, and exactness within int8 mode, since each token's rows are quantized
on their own: the same tokens whatever the block size, backend, prefix caching,
copy-on-write or preemption (recompute or swap) in between; and what it refuses."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.engine.config import EngineConfig
from pagedchat.engine.errors import RequestError
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.kernels import cpu

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def prompts(count: int = 4, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 500, (n,), generator=generator).tolist()
            for n in (3, 17, 60, 90)[:count]]


def run(folder, batch, params=GREEDY, **options) -> tuple[list[list[list[int]]], LLM]:
    with LLM(model=str(folder), **options) as llm:
        outs = [[c.token_ids for c in out.outputs] for out in llm.generate(batch, params)]
        return outs, llm


@pytest.fixture(scope="module")
def int8_tokens(tiny_model_dir) -> list[list[list[int]]]:
    """The tiny Llama's greedy tokens on int8 caches, with a plain pool."""
    return run(tiny_model_dir, prompts(), num_kv_blocks=256, kv_cache_dtype="int8")[0]


def test_int8_pool_holds_about_four_times_the_tokens(tiny_model_dir):
    plain = LLM(model=str(tiny_model_dir), kv_cache_memory="1MiB").engine
    small = LLM(model=str(tiny_model_dir), kv_cache_memory="1MiB",
                kv_cache_dtype="int8").engine
    head_dim = plain.model_config.head_dim
    assert small.runner.k_caches[0].dtype == torch.int8
    assert small.runner.block_bytes / plain.runner.block_bytes == (head_dim + 2) / (4 * head_dim)
    assert small.config.num_kv_blocks >= 3.5 * plain.config.num_kv_blocks


def test_int8_greedy_starts_as_float32_greedy(tiny_model_dir, int8_tokens):
    """Rounding K and V moves the logits a little: the first tokens agree (this random
    model, with heads of 16, drifts apart later; the real model's agreement is measured by
    ``bench quality``)."""
    plain = run(tiny_model_dir, prompts(), num_kv_blocks=256)[0]
    agree = [next((i for i, (a, b) in enumerate(zip(p[0], q[0], strict=True)) if a != b), 10)
             for p, q in zip(plain, int8_tokens, strict=True)]
    assert min(agree) >= 3 and sum(agree) >= 0.5 * 10 * len(agree), agree


@pytest.mark.parametrize("options", [
    {"block_size": 4, "attention_backend": "torch"},
    {"block_size": 2, "enable_prefix_caching": False},
    {"block_size": 4, "num_kv_blocks": 40, "max_num_batched_tokens": 24,
     "preemption_mode": "recompute"},
    {"block_size": 4, "num_kv_blocks": 40, "max_num_batched_tokens": 24,
     "preemption_mode": "swap"},
], ids=["torch-backend", "no-prefix-cache", "recompute", "swap"])
def test_int8_tokens_are_the_same_under_any_batching(tiny_model_dir, int8_tokens, options):
    options = {"num_kv_blocks": 256, **options}
    outs, llm = run(tiny_model_dir, prompts(), kv_cache_dtype="int8", **options)
    assert outs == int8_tokens
    if "preemption_mode" in options:
        assert llm.engine.scheduler.num_preemptions > 0


def test_int8_prefix_hits_and_copy_on_write_give_the_same_tokens(tiny_model_dir,
                                                                 monkeypatch):
    """Prompts sharing 40 tokens (prefix blocks reused), each with 2 samples forking from a
    partly filled block (copied on write): the same tokens as with neither."""
    shared = prompts(1, seed=1)[0] * 14
    batch = [shared[:40] + tail for tail in prompts(3, seed=2)]
    params = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    copies = []
    copy = cpu.copy_blocks
    monkeypatch.setattr(cpu, "copy_blocks",
                        lambda k, v, mapping: copies.append(len(mapping)) or copy(k, v, mapping))
    cached, llm = run(tiny_model_dir, batch, params, num_kv_blocks=256, block_size=16,
                      kv_cache_dtype="int8")
    assert sum(copies) > 0 and llm.engine.scheduler.block_manager.prefix_hits > 0
    plain, _ = run(tiny_model_dir, batch, params, num_kv_blocks=256, block_size=2,
                   enable_prefix_caching=False, kv_cache_dtype="int8")
    assert cached == plain


def test_kv_cache_dtype_is_checked(tiny_model_dir):
    with pytest.raises(RequestError, match="kv_cache_dtype must be auto or int8, got 'fp8'"):
        EngineConfig(kv_cache_dtype="fp8")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="the triton backend needs Triton")
def test_the_triton_backend_gives_the_int8_tokens(tiny_model_dir, int8_tokens):
    """The Triton kernels store and read the same int8 rows (interpreted on a CPU)."""
    outs, llm = run(tiny_model_dir, prompts(2), num_kv_blocks=64, kv_cache_dtype="int8",
                    attention_backend="triton",
                    params=SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert llm.engine.kv_cache_dtype == "int8"
    assert outs == [[tokens[0][:4]] for tokens in int8_tokens[:2]]


def test_stats_metrics_and_inspect_name_the_kv_dtype(tiny_model_dir):
    """EngineStats carries the KV dtype in force; /metrics and inspect's figures show it."""
    from pagedchat.cli.inspect_render import figures
    from pagedchat.server.metrics import ServerMetrics

    for kv, shown in (("auto", "float32"), ("int8", "int8")):
        engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), num_kv_blocks=8,
                                        kv_cache_dtype=kv))
        stats = engine.stats()
        assert stats.kv_cache_dtype == shown and figures(stats)["kv_cache_dtype"] == shown
        text = ServerMetrics().render(stats).decode()
        assert f'pagedchat_kv_cache_dtype_info{{dtype="{shown}"}} 1.0' in text
