"""Qwen3 and Phi-3 as Hugging Face folders: small random models saved by transformers, run by
the engine to transformers ``generate``'s greedy tokens (Phi-3's fused projections cut at
load, Qwen3's QK-norm)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedchat import LLM, SamplingParams
from tests.conftest import SMALL_VOCAB_SIZE, build_tiny_tokenizer
from tests.engine.models.test_gemma3 import greedy_tokens


def _model(family: str):
    """A random transformers model of ``family``, drawn wide (peaked next-token choices)."""
    from transformers import Phi3Config, Phi3ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    shape = dict(vocab_size=SMALL_VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 initializer_range=0.5, max_position_embeddings=512, bos_token_id=1,
                 eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    if family == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(head_dim=32, tie_word_embeddings=True, **shape))
    return Phi3ForCausalLM(Phi3Config(tie_word_embeddings=False, **shape))


@pytest.mark.parametrize("family", ["qwen3", "phi3"])
def test_folder_greedy_matches_transformers(tmp_path: Path, family):
    model = _model(family).eval()
    model.save_pretrained(tmp_path)
    build_tiny_tokenizer(SMALL_VOCAB_SIZE).save_pretrained(tmp_path)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(10, 2000, (n,), generator=g).tolist() for n in (4, 19, 50)]
    references = greedy_tokens(model, prompts, 10)
    llm = LLM(model=str(tmp_path), block_size=4, num_kv_blocks=64)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10),
                           use_progress=False)
    assert [o.outputs[0].token_ids for o in outputs] == references
