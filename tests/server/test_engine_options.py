"""What the engine adds for the server: logprobs, min_tokens, logit_bias, logits processors."""

from __future__ import annotations

import math

import pytest
import torch

from pagedchat.engine.errors import RequestError
from pagedchat.engine.sampling_params import SamplingParams

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]


def generate(llm, prompts, **options):
    return llm.generate(prompts, SamplingParams(**options), use_progress=False)


def test_logprobs_leave_greedy_tokens_unchanged(tiny_llm):
    plain = generate(tiny_llm, PROMPTS, temperature=0, max_tokens=12, ignore_eos=True)
    scored = generate(tiny_llm, PROMPTS, temperature=0, max_tokens=12, ignore_eos=True,
                      logprobs=5)
    for a, b in zip(plain, scored, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs is None


def test_logprobs_are_the_models_distribution(tiny_llm):
    out = generate(tiny_llm, PROMPTS[:1], temperature=0, max_tokens=6, ignore_eos=True,
                   logprobs=3)[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids) == 6
    total = 0.0
    for token, entry in zip(out.token_ids, out.logprobs, strict=True):
        first = next(iter(entry))
        assert first == token and entry[token].rank == 1  # greedy picks the most likely
        ranked = sorted(entry.values(), key=lambda lp: lp.rank)
        assert [lp.rank for lp in ranked] == [1, 2, 3]
        assert all(a.logprob >= b.logprob for a, b in zip(ranked, ranked[1:]))
        assert all(lp.logprob <= 0 for lp in ranked)
        total += entry[token].logprob
    assert total == pytest.approx(out.cumulative_logprob, abs=1e-3)


def test_sampled_token_outside_the_top_k_is_still_reported(tiny_llm):
    out = generate(tiny_llm, PROMPTS[:1], temperature=5.0, seed=3, max_tokens=24,
                   ignore_eos=True, logprobs=0)[0].outputs[0]
    assert all(list(entry) == [token] for token, entry in zip(out.token_ids, out.logprobs))
    assert any(entry[token].rank > 1 for token, entry in zip(out.token_ids, out.logprobs))


def test_logit_bias_forces_a_token(tiny_llm):
    out = generate(tiny_llm, PROMPTS[:1], temperature=0, max_tokens=4, ignore_eos=True,
                   logit_bias={42: 100.0})[0].outputs[0]
    assert out.token_ids == [42] * 4


def test_logit_bias_outside_the_vocabulary_is_refused(tiny_llm):
    with pytest.raises(RequestError, match="outside the vocabulary"):
        tiny_llm.engine.add_request("bad-bias", "hi", SamplingParams(logit_bias={10**9: 1.0}))


def test_min_tokens_masks_the_end_of_sequence(tiny_llm):
    eos = sorted(tiny_llm.engine.eos_token_ids)[0]
    # the bias makes the end token the greedy choice at every step
    ended = generate(tiny_llm, PROMPTS[:1], temperature=0, max_tokens=10,
                     logit_bias={eos: 100.0})[0].outputs[0]
    assert ended.token_ids == [eos] and ended.finish_reason == "stop"
    held = generate(tiny_llm, PROMPTS[:1], temperature=0, max_tokens=10, min_tokens=5,
                    logit_bias={eos: 100.0})[0].outputs[0]
    assert len(held.token_ids) == 6 and eos not in held.token_ids[:5]
    assert held.token_ids[5] == eos and held.finish_reason == "stop"


def test_logits_processor_sees_each_sequence_history(tiny_llm):
    seen: list[list[int]] = []

    def only_even(history: list[int], row: torch.Tensor) -> torch.Tensor:
        seen.append(list(history))
        row[1::2] = -math.inf
        return row

    outs = generate(tiny_llm, PROMPTS[:1], temperature=1.0, seed=0, n=2, max_tokens=5,
                    ignore_eos=True, logits_processors=[only_even])[0].outputs
    for out in outs:
        assert all(token % 2 == 0 for token in out.token_ids)
        for length in range(5):
            assert out.token_ids[:length] in seen


@pytest.mark.parametrize("options, message", [
    ({"logprobs": 21}, "logprobs"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ({"logit_bias": {1: 101.0}}, "logit_bias"),
    ({"use_beam_search": True, "temperature": 0, "logprobs": 1}, "beam search"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(RequestError, match=message):
        SamplingParams(**options)
