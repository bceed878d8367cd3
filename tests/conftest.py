"""Shared fixtures: a tiny random Llama for fast tests, the real default model for slow ones.

Models are built or converted once per session; the converted default model lives
in a per-user cache (``PAGEDCHAT_CACHE_DIR``), so only the first run pays for it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton picks interpreter or compiler once, when first imported, and transformers'
    # modeling code imports it: set the interpreter before any test module is collected.
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """The default SmolLM2-135M-Instruct, converted from its GGUF to an HF folder."""
    from pagedchat.engine.loading.loader import prepare_model

    return prepare_model(None).folder


def save_tiny_llama(folder: Path, tokenizer_dir: Path, rope_parameters: dict | None = None,
                    **shape) -> Path:
    """A 2-layer random Llama with the real SmolLM2 tokenizer, saved as an HF folder.

    Weights are drawn with a wide init so that its next-token distributions are
    peaked (a near-uniform random model would make every greedy step a near-tie)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), num_hidden_layers=2, max_position_embeddings=1024,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True, initializer_range=0.5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id, **shape,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, real_model_dir: Path) -> Path:
    """4 query heads, 2 KV heads: the model of the fast tests."""
    return save_tiny_llama(
        tmp_path_factory.mktemp("tiny-llama"), real_model_dir, hidden_size=64,
        intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)


@pytest.fixture(scope="session")
def tiny_tp_model_dir(tmp_path_factory, real_model_dir: Path) -> Path:
    """8 query heads, 4 KV heads: splits over 1, 2 or 4 tensor-parallel workers."""
    return save_tiny_llama(
        tmp_path_factory.mktemp("tiny-llama-tp"), real_model_dir, hidden_size=128,
        intermediate_size=256, num_attention_heads=8, num_key_value_heads=4, head_dim=16)


@pytest.fixture(scope="session")
def tiny_llm(tiny_model_dir: Path):
    """One engine on the tiny model, shared by tests that only submit requests."""
    from pagedchat import LLM

    return LLM(model=str(tiny_model_dir), num_kv_blocks=256, block_size=16)


@pytest.fixture(scope="session")
def make_tiny_llama(tmp_path_factory, real_model_dir: Path):
    """Build another tiny Llama: ``make_tiny_llama(name, rope_parameters=..., **shape)``."""
    def make(name: str, rope_parameters: dict | None = None, **shape) -> Path:
        shape = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 16, **shape}
        return save_tiny_llama(tmp_path_factory.mktemp(name), real_model_dir, rope_parameters,
                               **shape)
    return make
