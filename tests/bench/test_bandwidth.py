"""The memory-speed figure: bytes read per decode token and the share of copy bandwidth."""

from __future__ import annotations

import math

import gguf
import pytest

from pagedchat import LLM
from pagedchat_lab.bandwidth import (
    bandwidth_share,
    copy_bandwidth,
    decode_shares,
    gguf_bytes_per_token,
    pagedchat_bytes_per_token,
)
from pagedchat_lab.synthetic_gguf import SHAPES

TINY = SHAPES["tiny"]


def test_share_is_tokens_times_bytes_over_bandwidth():
    assert bandwidth_share(10.0, 1e8, 2e9) == pytest.approx(0.5)
    assert bandwidth_share(40.0, 6.2e9, 496e9) == pytest.approx(0.5)


def test_copy_bandwidth_is_a_positive_rate():
    found = copy_bandwidth(size=1 << 24, repeats=2)
    assert math.isfinite(found) and found > 0


def test_gguf_bytes_are_its_tensors_and_a_float16_kv_cache(tiny_gguf):
    reader = gguf.GGUFReader(tiny_gguf)
    stored = sum(int(t.n_bytes) for t in reader.tensors)  # tied: the embedding is the head
    kv_per_token = 2 * TINY.layers * TINY.kv_heads * TINY.head_dim * 2
    assert gguf_bytes_per_token(tiny_gguf, 0) == stored
    assert gguf_bytes_per_token(tiny_gguf, 100) == stored + 100 * kv_per_token


def test_quantized_weights_read_the_bytes_the_file_stores(tiny_gguf):
    engine = LLM(model=str(tiny_gguf), num_kv_blocks=32, weights="gguf").engine
    kv_per_token = 2 * TINY.layers * TINY.kv_heads * TINY.head_dim * 4
    assert (pagedchat_bytes_per_token(engine, 64)
            == gguf_bytes_per_token(tiny_gguf, 0) + 64 * kv_per_token)


def test_pagedchat_bytes_are_its_weights_and_kv_cache(tiny_gguf):
    engine = LLM(model=str(tiny_gguf), num_kv_blocks=32, weights="float32").engine
    vocab = len(engine.tokenizer)
    weights = TINY.parameters(vocab) * 4  # float32, the head tied to the embedding
    assert pagedchat_bytes_per_token(engine, 0) == weights
    kv_per_token = 2 * TINY.layers * TINY.kv_heads * TINY.head_dim * 4
    assert pagedchat_bytes_per_token(engine, 64) == weights + 64 * kv_per_token
    figures = {"pagedchat": {"decode_tokens_per_s": 100.0},
               "llama.cpp": {"decode_tokens_per_s": 300.0}}
    decode_shares(engine, figures, 64, 1e9)
    assert figures["pagedchat"]["bandwidth_share"] == pytest.approx(
        100 * (weights + 64 * kv_per_token) / 1e9)
    assert figures["llama.cpp"]["bytes_per_token_mb"] == pytest.approx(
        gguf_bytes_per_token(tiny_gguf, 64) / 1e6)


def test_a_windowed_layer_reads_only_its_window(tmp_path, tiny_tokenizer):
    from tests.engine.models.test_gemma3 import WINDOW, save_tiny_gemma3

    folder = save_tiny_gemma3(tmp_path / "gemma", tiny_tokenizer)
    engine = LLM(model=str(folder), block_size=4, num_kv_blocks=64).engine
    windows = engine.runner.kv_groups.windows
    weights = pagedchat_bytes_per_token(engine, 0)
    per_layer_token = engine.runner.block_bytes // engine.runner.kv_groups.layers_per_page // 4
    context = 4 * WINDOW
    read = sum(context if window is None else WINDOW for window in windows)
    assert windows.count(None) == 1 and len(windows) == 4
    assert pagedchat_bytes_per_token(engine, context) == weights + read * per_layer_token
