"""Gemma 3 on random weights: greedy tokens equal transformers ``generate``.

Tiny configs with a small sliding window (16 tokens) so that short prompts already cross
it, local and global layers mixed, a head_dim that is not hidden / heads (and one of 256,
the real model's), one KV head, a query scale of its own and soft-capped logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.engine.model_config import ModelConfig

WINDOW = 16
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]


def save_tiny_gemma3(folder: Path, tokenizer, **shape) -> Path:
    """A 4-layer random Gemma 3 with the tiny models' tokenizer. Norm weights are drawn
    too (checkpoints start them at zero), so ``1 + w`` is exercised."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    options = {
        "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 32, "sliding_window": WINDOW, "layer_types": LAYER_TYPES,
        "query_pre_attn_scalar": 24, "final_logit_softcapping": 30.0,
        "max_position_embeddings": 1024, "initializer_range": 0.5,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.eos_token_id, **shape,
    }
    config = Gemma3TextConfig(**options)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_gemma_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3"), tiny_tokenizer)


@pytest.fixture(scope="module")
def wide_head_gemma_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """head_dim 256 with 4 query heads and one KV head, as the real model."""
    return save_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3-256"), tiny_tokenizer,
                            head_dim=256)


def prompts(count: int = 6, seed: int = 0) -> list[list[int]]:
    """Prompts from 3 to 90 tokens: inside, across and far beyond the window."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [3, 15, 17, 33, 60, 90][:count]
    return [torch.randint(10, 500, (n,), generator=generator).tolist() for n in lengths]


def reference(folder: Path, prompt_sets: list[list[int]], max_tokens: int,
              **load) -> list[list[int]]:
    """transformers' greedy tokens after each prompt, in float32, from the checkpoint in
    ``folder`` (``load``: more arguments for ``from_pretrained``, e.g. ``gguf_file``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **load).eval()
    return greedy_tokens(model, prompt_sets, max_tokens)


def greedy_tokens(model, prompt_sets: list[list[int]], max_tokens: int) -> list[list[int]]:
    """A transformers model's ``generate`` greedy tokens after each prompt, one at a time."""
    outs = []
    for ids in prompt_sets:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens,
                                 do_sample=False, attention_mask=torch.ones(1, len(ids)))
        outs.append(out[0, len(ids):].tolist())
    return outs


@pytest.fixture(scope="module")
def tiny_gemma_references(tiny_gemma_dir) -> list[list[int]]:
    """transformers' 24 greedy tokens for ``prompts()``, made once for every engine option."""
    return reference(tiny_gemma_dir, prompts(), 24)


def generate(folder: Path, prompt_sets: list[list[int]], max_tokens: int, **options):
    return generate_counting(folder, prompt_sets, max_tokens, **options)[0]


def generate_counting(folder: Path, prompt_sets: list[list[int]], max_tokens: int,
                      **options) -> tuple[list[list[int]], int]:
    """Each prompt's greedy tokens, and how many preemptions the run took."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    with LLM(model=str(folder), **options) as llm:
        outs = [out.outputs[0].token_ids for out in llm.generate(prompt_sets, params)]
        return outs, llm.engine.scheduler.num_preemptions


def test_config_reads_the_layer_pattern_and_both_ropes(tiny_gemma_dir):
    config = ModelConfig.from_folder(tiny_gemma_dir)
    assert config.model_type == "gemma3_text"
    assert config.layer_types == tuple(LAYER_TYPES)
    assert config.sliding_window == WINDOW
    assert config.head_dim == 32 and config.num_key_value_heads == 1
    assert config.rope_theta == 1_000_000.0
    assert config.local_rope_parameters["rope_theta"] == 10_000.0
    assert config.final_logit_softcapping == 30.0


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_greedy_matches_transformers(tiny_gemma_dir, tiny_gemma_references, backend,
                                     block_size):
    batch = prompts()
    expected = tiny_gemma_references
    got = generate(tiny_gemma_dir, batch, 24, attention_backend=backend,
                   block_size=block_size, num_kv_blocks=256)
    assert got == expected


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_chunked_prefill_and_preemption_match_transformers(tiny_gemma_dir,
                                                           tiny_gemma_references, mode):
    """A token budget that chunks the prompts and a pool that forces preemption (its
    blocks hold one layer each: the config's layers make four groups of one)."""
    batch = prompts()
    expected = tiny_gemma_references
    got, preemptions = generate_counting(tiny_gemma_dir, batch, 24, block_size=4,
                                         num_kv_blocks=64, max_num_batched_tokens=24,
                                         preemption_mode=mode)
    assert preemptions > 0
    assert got == expected


def test_head_dim_256_matches_transformers(wide_head_gemma_dir):
    batch = prompts(4)
    expected = reference(wide_head_gemma_dir, batch, 16)
    assert generate(wide_head_gemma_dir, batch, 16, num_kv_blocks=128) == expected


def test_int8_kv_cache_over_windows_and_preemption(tiny_gemma_dir, tiny_gemma_references):
    """int8 K/V rows in the local layers' windows and the global layers' blocks: the same
    tokens with a pool that swaps as without (each token's rows quantized on their own),
    and here, where this model's margins are wider than the rounding, transformers'."""
    plain = generate(tiny_gemma_dir, prompts(), 24, num_kv_blocks=256, kv_cache_dtype="int8")
    swapped, preemptions = generate_counting(
        tiny_gemma_dir, prompts(), 24, block_size=4, num_kv_blocks=64,
        max_num_batched_tokens=24, preemption_mode="swap", kv_cache_dtype="int8")
    assert preemptions > 0 and swapped == plain
    assert plain == tiny_gemma_references
