"""Gemma 3 on random weights with its local layers' blocks freed as the window slides:
greedy tokens still equal transformers ``generate`` with forks (n > 1, beams), prefix
hits past the window (a regenerate's of the whole prompt too), and preemption; and the
local groups hold only their window.

The tiny config's 3 local and 1 global layers make four groups of one layer each (see
``engine/kv_groups.py``), with a window of 16 tokens and blocks of 4."""

from __future__ import annotations

import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.engine.blocks import HOLE
from tests.engine.models.test_gemma3 import WINDOW, prompts, reference, save_tiny_gemma3
from tests.engine.sampling.test_beam_search import assert_same_beams, hf_beams

BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory, tiny_tokenizer):
    return save_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3-groups"), tiny_tokenizer)


def test_the_pool_is_split_into_one_global_and_three_local_groups(gemma_dir):
    with LLM(model=str(gemma_dir), block_size=BLOCK_SIZE, num_kv_blocks=64) as llm:
        groups = llm.engine.runner.kv_groups
        assert groups.windows == (None, WINDOW, WINDOW, WINDOW)
        assert groups.layers_per_page == 1
        assert llm.engine.scheduler.block_manager.windows == groups.windows


def test_local_blocks_go_back_while_the_sequence_runs(gemma_dir):
    """Every step, each local table holds only the blocks its next token's window and
    the step's chunk need; the tokens still equal transformers'."""
    prompt = prompts()[-1]  # 90 tokens
    expected = reference(gemma_dir, [prompt], 30)[0]
    budget = 24
    with LLM(model=str(gemma_dir), block_size=BLOCK_SIZE, num_kv_blocks=128,
             max_num_batched_tokens=budget) as llm:
        engine = llm.engine
        bm = engine.scheduler.block_manager
        engine.add_request("long", prompt, SamplingParams(temperature=0, max_tokens=30,
                                                          ignore_eos=True))
        out = None
        while engine.has_unfinished_requests():
            for output in engine.step():
                out = output
            for group in engine.scheduler.running:
                for seq in group.unfinished_seqs:
                    for g, table in enumerate(seq.block_tables):
                        if bm.windows[g] is None:
                            assert HOLE not in table
                            continue
                        held = [b for b in table if b != HOLE]
                        assert len(held) <= bm.blocks_for(WINDOW - 1 + budget) + 1
        assert out.outputs[0].token_ids == expected
        freed = engine.stats().window_freed_blocks
        # 120 tokens: each of the 3 local groups ends holding at most 6 of its 30 blocks
        assert freed >= 3 * (30 - 6)
        assert engine.stats().used_blocks == 0


def test_parallel_samples_share_and_fork_local_blocks(gemma_dir):
    """n = 3 greedy samples fork after the prompt (sharing every group's blocks, copying
    the partly filled last ones) and each equals transformers' greedy tokens."""
    batch = prompts()[2:]
    expected = reference(gemma_dir, batch, 20)
    params = SamplingParams(n=3, temperature=0, max_tokens=20, ignore_eos=True)
    with LLM(model=str(gemma_dir), block_size=BLOCK_SIZE, num_kv_blocks=512) as llm:
        outs = llm.generate(batch, params)
        assert llm.engine.stats().used_blocks == 0
    for out, tokens in zip(outs, expected, strict=True):
        assert [o.token_ids for o in out.outputs] == [tokens] * 3


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_parallel_samples_survive_preemption(gemma_dir, mode):
    batch = prompts()[3:]
    expected = reference(gemma_dir, batch, 20)
    params = SamplingParams(n=2, temperature=0, max_tokens=20, ignore_eos=True)
    with LLM(model=str(gemma_dir), block_size=BLOCK_SIZE, num_kv_blocks=136,
             max_num_batched_tokens=32, preemption_mode=mode) as llm:
        outs = llm.generate(batch, params)
        assert llm.engine.scheduler.num_preemptions > 0
        assert llm.engine.stats().used_blocks == 0
    for out, tokens in zip(outs, expected, strict=True):
        assert [o.token_ids for o in out.outputs] == [tokens] * 2


def test_beam_search_matches_transformers(gemma_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(gemma_dir, dtype=torch.float32).eval()
    batch = prompts()[3:5]
    params = SamplingParams(n=2, best_of=3, use_beam_search=True, temperature=0,
                            max_tokens=12)
    with LLM(model=str(gemma_dir), block_size=BLOCK_SIZE, num_kv_blocks=256) as llm:
        outs = llm.generate(batch, params)
        eos = llm.engine.eos_token_ids
        assert llm.engine.stats().used_blocks == 0
    for ids, out in zip(batch, outs, strict=True):
        assert_same_beams(out, *hf_beams(hf, ids, params, eos), params.length_penalty)


def test_prefix_hit_past_the_window_matches_transformers(gemma_dir):
    """A second request sharing a 60-token prefix takes the global blocks of it and only
    the local blocks of its window, and still decodes transformers' tokens."""
    generator = torch.Generator().manual_seed(3)
    shared = torch.randint(10, 500, (60,), generator=generator).tolist()
    first, second = shared + [11, 12, 13], shared + [21, 22]
    expected = reference(gemma_dir, [first, second], 16)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    with LLM(model=str(gemma_dir), block_size=BLOCK_SIZE, num_kv_blocks=256) as llm:
        got_first = llm.generate(first, params)[0]
        got_second = llm.generate(second, params)[0]
    assert got_second.num_cached_tokens == 60
    assert [got_first.outputs[0].token_ids, got_second.outputs[0].token_ids] == expected


@pytest.mark.parametrize("length", [61, 64], ids=["inside-a-block", "whole-blocks"])
def test_a_regenerate_past_the_window_computes_no_prompt_token(gemma_dir, length):
    """The same prompt again takes the global blocks, each local group's window and a copy
    of the block the first reply filled, computes nothing and decodes transformers'
    tokens from the kept row."""
    prompt = torch.randint(10, 500, (length,),
                           generator=torch.Generator().manual_seed(length)).tolist()
    expected = reference(gemma_dir, [prompt], 12)[0]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    with LLM(model=str(gemma_dir), block_size=BLOCK_SIZE, num_kv_blocks=256) as llm:
        first = llm.generate(prompt, params)[0]
        again = llm.generate(prompt, params)[0]
        forwarded = llm.engine.runner.tokens_forwarded
        assert llm.engine.stats().used_blocks == 0
    assert again.num_cached_tokens == length
    assert forwarded == length + 11 + 11  # the prompt once, then each reply's decodes
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == expected


def test_a_pool_sized_for_one_request_counts_every_group(gemma_dir):
    """`pagedchat run`'s pool for one request: the scheduler admits the request into a pool
    of exactly that size (global and local groups counted), and not into one block less."""
    from pagedchat.engine.config import EngineConfig
    from pagedchat.engine.errors import RequestError
    from pagedchat.engine.kv_groups import kv_groups
    from pagedchat.engine.model_config import ModelConfig

    windows = kv_groups(ModelConfig.from_folder(gemma_dir)).windows
    params = SamplingParams(max_tokens=300, n=2)
    prompt = prompts()[-1]
    probe = EngineConfig(block_size=BLOCK_SIZE, max_model_len=1024)
    blocks = probe.request_kv_blocks(len(prompt), params.max_tokens, params.best_of, windows)
    assert blocks > probe.request_kv_blocks(len(prompt), params.max_tokens, params.best_of)
    with LLM(model=str(gemma_dir), block_size=BLOCK_SIZE, num_kv_blocks=blocks) as llm:
        llm.engine.add_request("a", prompt, params)
    with LLM(model=str(gemma_dir), block_size=BLOCK_SIZE, num_kv_blocks=blocks - 1) as llm:
        with pytest.raises(RequestError, match="needs up to"):
            llm.engine.add_request("a", prompt, params)
