"""Beam search equals transformers' ``generate(num_beams=k)``; beams share and free blocks.

The tiny random Llama checks every early-stopping mode and length penalty fast; the
real SmolLM2 checks k = 2 and 4 on six chat prompts. Both compare the returned beams
token for token, in order, and their length-penalised scores.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.engine.errors import RequestError
from tests.engine.test_llm_engine import _prompts

CASES = [  # beam width, n returned, length_penalty, early_stopping, repetition_penalty
    (2, 2, 1.0, False, 1.0),
    (4, 4, 1.0, False, 1.0),
    (4, 2, 0.5, True, 1.0),
    (2, 1, 2.0, "never", 1.0),
    (4, 3, -1.0, "never", 1.0),
    (3, 2, 1.0, False, 1.3),
]


def _params(width, n, length_penalty, early_stopping, max_tokens, repetition_penalty=1.0
            ) -> SamplingParams:
    return SamplingParams(n=n, best_of=width, use_beam_search=True, temperature=0,
                          max_tokens=max_tokens, length_penalty=length_penalty,
                          early_stopping=early_stopping, repetition_penalty=repetition_penalty)


def hf_beams(hf, ids, params: SamplingParams, eos: set[int]) -> tuple[list[list[int]], list[float]]:
    """transformers' returned beams (cut after their EOS: shorter ones are padded) and scores."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)), do_sample=False,
            num_beams=params.best_of, num_return_sequences=params.n,
            max_new_tokens=params.max_tokens, length_penalty=params.length_penalty,
            early_stopping=params.early_stopping,
            repetition_penalty=params.repetition_penalty, output_scores=True,
            return_dict_in_generate=True)
    beams = []
    for row in out.sequences[:, len(ids):].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        beams.append(row[:end])
    return beams, out.sequences_scores.tolist()


def assert_same_beams(ours, ref_beams, ref_scores, length_penalty):
    assert [o.token_ids for o in ours.outputs] == ref_beams
    assert ours.beam_scores == pytest.approx(ref_scores, rel=1e-4, abs=1e-5)
    for out, score in zip(ours.outputs, ours.beam_scores, strict=True):
        assert out.cumulative_logprob / len(out.token_ids) ** length_penalty == pytest.approx(
            score, rel=1e-5)


@pytest.mark.parametrize("width, n, length_penalty, early_stopping, repetition_penalty", CASES)
def test_tiny_beam_search_matches_transformers(width, n, length_penalty, early_stopping,
                                               repetition_penalty, tiny_llm, tiny_hf_model):
    prompts = _prompts(6, seed=4)
    params = _params(width, n, length_penalty, early_stopping, 20, repetition_penalty)
    outputs = tiny_llm.generate(prompts, params)
    eos = tiny_llm.engine.eos_token_ids
    for ids, out in zip(prompts, outputs, strict=True):
        assert_same_beams(out, *hf_beams(tiny_hf_model, ids, params, eos), length_penalty)
    assert tiny_llm.engine.stats().used_blocks == 0


@pytest.mark.slow
def test_real_beam_search_matches_transformers(real_model_dir, real_hf_model,
                                              shared_model_loads):
    hf = real_hf_model
    llm = LLM(model=str(real_model_dir), num_kv_blocks=256)
    questions = ["What is the capital of France?", "Write a haiku about memory.",
                 "How do I sort a list in Python?", "Why is the sky blue?",
                 "Name three prime numbers.", "Tell me a joke about cats."]
    prompts = [llm.encode_chat([{"role": "user", "content": q}]) for q in questions]
    for width, group in ((2, prompts[:3]), (4, prompts[3:])):  # each beside two others
        params = _params(width, width, 1.0, False, max_tokens=24)
        for ids, out in zip(group, llm.generate(group, params), strict=True):
            assert_same_beams(out, *hf_beams(hf, ids, params, llm.engine.eos_token_ids), 1.0)


def test_beams_share_history_and_dying_beams_free_at_once(tiny_llm):
    """After every step the pool holds exactly the live beams' blocks, each block once,
    with a ref count equal to the beams holding it; pruned beams hold nothing."""
    engine = tiny_llm.engine
    engine.add_request("beam", list(range(300, 340)), _params(4, 2, 1.0, "never", 40))
    shared_seen = pruned_seen = 0
    while engine.has_unfinished_requests():
        before = list(engine.scheduler.running[0].seqs) if engine.scheduler.running else []
        engine.step()
        group = engine.scheduler.find("beam")
        if group is None:
            break
        pruned = [seq for seq in before if seq not in group.seqs]
        assert all(seq.block_table == [] for seq in pruned)
        pruned_seen += len(pruned)
        refs = Counter(b for seq in group.seqs for b in seq.block_table)
        assert engine.stats().used_blocks == len(refs)
        assert all(engine.scheduler.block_manager.blocks[b].ref_count == c for b, c in refs.items())
        shared_seen += sum(1 for c in refs.values() if c > 1)
    assert shared_seen and pruned_seen
    assert engine.stats().used_blocks == 0


def test_beam_search_rejects_what_it_cannot_honour(tiny_llm):
    with pytest.raises(RequestError, match="temperature=0"):
        SamplingParams(use_beam_search=True, best_of=2, temperature=0.7)
    with pytest.raises(RequestError, match="early_stopping"):
        SamplingParams(use_beam_search=True, best_of=2, temperature=0, early_stopping="soon")
    with pytest.raises(RequestError, match="stop strings"):
        tiny_llm.engine.add_request("x", [1, 2, 3], SamplingParams(
            use_beam_search=True, best_of=2, temperature=0, stop=["."]))


def _mixed_requests() -> list[tuple[list[int], SamplingParams]]:
    """Beam groups and seeded n = 4 sampling groups, prompts 20-60 tokens."""
    prompts = [list(range(100 + 7 * i, 100 + 7 * i + 20 + 8 * i)) for i in range(6)]
    beam = _params(4, 2, 1.0, False, max_tokens=24)
    return [(ids, beam if i % 2 else SamplingParams(n=4, temperature=1.0, seed=i, max_tokens=24))
            for i, ids in enumerate(prompts)]


def _run_checking_groups(llm: LLM, requests) -> tuple[list, int]:
    """Run to the end; after every step each group is wholly running, waiting or swapped.
    Returns the outputs and how many times a forked group sat preempted."""
    engine = llm.engine
    for i, (ids, params) in enumerate(requests):
        engine.add_request(str(i), ids, params)
    finished, preempted_forked = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        sched = engine.scheduler
        for group in sched.running:
            assert all(seq.block_table and not seq.cpu_block_tables for seq in group.seqs)
        for group in sched.swapped:
            assert all(seq.cpu_block_tables and not seq.block_table for seq in group.seqs)
        for group in sched.waiting:
            assert all(not seq.block_table and not seq.cpu_block_tables for seq in group.seqs)
        preempted_forked += sum(len(g.seqs) > 1 for g in [*sched.waiting, *sched.swapped])
    assert engine.stats().used_blocks == 0
    return [finished[str(i)] for i in range(len(requests))], preempted_forked


@pytest.fixture(scope="module")
def unpreempted(tiny_model_dir) -> list:
    roomy = LLM(model=str(tiny_model_dir), block_size=4, num_kv_blocks=2048)
    return _run_checking_groups(roomy, _mixed_requests())[0]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempted_beam_and_sampling_groups_give_the_same_outputs(mode, tiny_model_dir,
                                                                  unpreempted):
    requests = _mixed_requests()
    tight = LLM(model=str(tiny_model_dir), block_size=4, num_kv_blocks=90,
                preemption_mode=mode, swap_space="16MiB")
    outputs, preempted_forked = _run_checking_groups(tight, requests)
    stats = tight.engine.stats()
    assert stats.preemptions > 0 and preempted_forked > 0
    if mode == "swap":
        assert stats.swapped_out > 0
    for ours, ref in zip(outputs, unpreempted, strict=True):
        assert [o.token_ids for o in ours.outputs] == [o.token_ids for o in ref.outputs]
        # recomputed K/V come from a prefill, not step by step: the same up to float noise
        assert ours.beam_scores == pytest.approx(ref.beam_scores, rel=1e-5)
