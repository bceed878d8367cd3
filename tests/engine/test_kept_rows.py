"""A regenerated reply computes no prompt token: its prompt's blocks are all cached (the
last one a copy of the block the earlier reply filled) and its first token is sampled
from the hidden state kept when that prompt was first computed. Its tokens must equal a
cold computation's, whatever it is batched with and however it samples."""

from __future__ import annotations

import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.engine.step_input import KEPT_ROWS
from tests.engine.test_llm_engine import _hf_greedy

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def _prompt(length: int, seed: int) -> list[int]:
    return torch.randint(3, 49000, (length,), generator=torch.Generator().manual_seed(seed)
                         ).tolist()


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(model=str(tiny_model_dir), num_kv_blocks=256, block_size=16)


@pytest.fixture
def steps(llm, monkeypatch):
    """Per step the runner ran: (query rows, kept rows sampled, model forwards)."""
    runner = llm.engine.runner
    seen: list[tuple[int, int, int]] = []
    forwards = [0]
    forward, execute = runner.model.forward, runner.execute

    def counting_forward(*args, **kwargs):
        forwards[0] += 1
        return forward(*args, **kwargs)

    def recording(step):
        before = forwards[0]
        result = execute(step)
        seen.append((len(step.input_ids), len(step.from_kept), forwards[0] - before))
        return result

    monkeypatch.setattr(runner.model, "forward", counting_forward)
    monkeypatch.setattr(runner, "execute", recording)
    llm.engine.reset_prefix_cache()
    return seen


@pytest.mark.parametrize("length", [45, 48], ids=["inside-a-block", "whole-blocks"])
def test_a_regenerate_alone_runs_no_layer_and_matches_transformers(llm, steps, tiny_hf_model,
                                                                   length):
    prompt = _prompt(length, seed=length)
    first = llm.generate([prompt], GREEDY)[0]
    steps.clear()
    again = llm.generate([prompt], GREEDY)[0]
    assert again.num_cached_tokens == length
    assert steps[0] == (0, 1, 0)  # no query row, one kept row, no forward
    assert all(rows == 1 for rows, _, _ in steps[1:])
    expected = _hf_greedy(tiny_hf_model, prompt, GREEDY.max_tokens)
    assert again.outputs[0].token_ids == first.outputs[0].token_ids == expected
    assert llm.engine.stats().used_blocks == 0


def test_kept_and_computed_rows_share_a_step(llm, steps, tiny_hf_model):
    """A regenerate admitted with a new prompt and a decoding request: one step samples
    the kept row beside the computed ones, and each request gets its cold tokens."""
    known, fresh, running = _prompt(45, 1), _prompt(30, 2), _prompt(20, 3)
    llm.generate([known], GREEDY)
    engine = llm.engine
    engine.add_request("running", running, GREEDY)
    engine.step()
    steps.clear()
    engine.add_request("again", known, GREEDY)
    engine.add_request("fresh", fresh, GREEDY)
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out
    assert steps[0] == (1 + len(fresh), 1, 1)
    assert outputs["again"].num_cached_tokens == len(known)
    for name, prompt in (("again", known), ("fresh", fresh), ("running", running)):
        assert outputs[name].outputs[0].token_ids == _hf_greedy(tiny_hf_model, prompt, 20)


@pytest.mark.parametrize("params", [
    SamplingParams(n=3, temperature=0.9, seed=5, max_tokens=12, logprobs=2, ignore_eos=True),
    SamplingParams(temperature=0.7, top_k=40, repetition_penalty=1.3, seed=7, max_tokens=12,
                   logit_bias={17: 3.0}, ignore_eos=True),
    SamplingParams(n=2, best_of=3, use_beam_search=True, temperature=0, max_tokens=10,
                   ignore_eos=True),
], ids=["n3-seeded-logprobs", "penalties", "beams"])
def test_every_sampling_path_from_a_kept_row_repeats_the_cold_one(llm, steps, params):
    """The kept row gives the logits the computed one gave: seeded samples, log-probs,
    penalties and beams come out the same."""
    prompt = _prompt(45, 4)
    cold = llm.generate([prompt], params)[0]
    steps.clear()
    warm = llm.generate([prompt], params)[0]
    assert warm.num_cached_tokens == len(prompt) and steps[0][:2] == (0, 1)
    for ours, theirs in zip(warm.outputs, cold.outputs, strict=True):
        assert ours.token_ids == theirs.token_ids
        assert ours.cumulative_logprob == pytest.approx(theirs.cumulative_logprob, abs=1e-5)
        assert (ours.logprobs is None) == (theirs.logprobs is None)
        for mine, cold_entry in zip(ours.logprobs or [], theirs.logprobs or [], strict=True):
            assert mine.keys() == cold_entry.keys()
            for token, entry in mine.items():
                assert entry.logprob == pytest.approx(cold_entry[token].logprob, abs=1e-5)
    assert warm.beam_scores == pytest.approx(cold.beam_scores, abs=1e-5)


def test_only_the_exact_prompt_finds_its_kept_row(llm, steps, tiny_hf_model):
    """A prompt whose every token is cached but whose last token differs from a kept
    prompt's computes its last token (its kept row would be another prompt's)."""
    kept = _prompt(45, 5)
    other = kept[:-1] + [kept[-1] + 1]
    llm.generate([other + [11, 12, 13]], GREEDY)  # every token of `other` in full blocks
    llm.generate([kept], GREEDY)
    out = llm.generate([other], GREEDY)[0]
    assert out.num_cached_tokens == len(other) - 1
    assert out.outputs[0].token_ids == _hf_greedy(tiny_hf_model, other, 20)


def test_the_kept_rows_are_bounded_and_forgotten_with_the_prefix_cache(llm, steps):
    prompt = _prompt(45, 6)
    first = llm.generate([prompt], GREEDY)[0].outputs[0].token_ids
    llm.generate([_prompt(20, 100 + i) for i in range(KEPT_ROWS)], GREEDY)
    bm = llm.engine.scheduler.block_manager
    assert len(bm.kept_rows.slots) == KEPT_ROWS == len(llm.engine.runner.kept)
    again = llm.generate([prompt], GREEDY)[0]  # its row given up: the last token computed
    assert again.num_cached_tokens == len(prompt) - 1
    assert again.outputs[0].token_ids == first
    llm.engine.reset_prefix_cache()
    assert not bm.kept_rows.slots
    assert llm.generate([prompt], GREEDY)[0].num_cached_tokens == 0


@pytest.mark.parametrize("options", [dict(speculative="ngram"), dict(kv_cache_dtype="int8")],
                         ids=["speculative", "int8"])
def test_a_regenerate_computes_nothing_with_drafts_and_with_int8(tiny_model_dir, options):
    """Under speculative decoding and over an int8 pool the regenerate computes no prompt
    token and repeats the first reply's greedy tokens."""
    with LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16, **options) as llm:
        prompt = _prompt(45, 7)
        first = llm.generate([prompt], GREEDY)[0]
        again = llm.generate([prompt], GREEDY)[0]
    assert again.num_cached_tokens == len(prompt)
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
