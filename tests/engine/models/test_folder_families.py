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
    # int8 K/V rows (Qwen3's normed keys, Phi-3's cut projections): the same first tokens;
    # a pool that preempts gives the same tokens as one that does not
    int8 = _tokens(tmp_path, prompts, num_kv_blocks=64)
    squeezed = _tokens(tmp_path, prompts, num_kv_blocks=20, max_num_batched_tokens=16)
    assert squeezed == int8 and [t[0] for t in int8] == [t[0] for t in references]


def _tokens(folder: Path, prompts: list[list[int]], **options) -> list[list[int]]:
    """Greedy tokens on int8 KV caches, checking that ``options`` made the engine preempt
    where the pool is under 64 blocks."""
    with LLM(model=str(folder), block_size=4, kv_cache_dtype="int8", **options) as llm:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10,
                                                       ignore_eos=True))
        assert (llm.engine.scheduler.num_preemptions > 0) == (options["num_kv_blocks"] < 64)
        return [o.outputs[0].token_ids for o in outputs]
