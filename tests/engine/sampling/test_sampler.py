"""The sampler's filters on hand-made distributions, and its draws against their odds."""

from __future__ import annotations

import math

import pytest
import torch

from pagedchat.engine.sampling.sampler import SampleRow, apply_penalties, filter_logits, sample
from pagedchat.engine.sampling_params import SamplingParams


def row(**options) -> SampleRow:
    return SampleRow(SamplingParams(**options), [], [], None)


def kept(logits: torch.Tensor, **options) -> list[int]:
    out = filter_logits(logits.clone().unsqueeze(0), [row(**options)])[0]
    return sorted(torch.isfinite(out).nonzero().flatten().tolist())


PROBS = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
LOGITS = PROBS.log()


def test_top_k_keeps_the_k_best():
    assert kept(LOGITS, top_k=2) == [0, 1]
    assert kept(LOGITS, top_k=0) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("top_p, expected", [
    (0.5, [0]), (0.51, [0, 1]), (0.7, [0, 1]), (0.71, [0, 1, 2]), (1.0, [0, 1, 2, 3, 4])])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, expected):
    assert kept(LOGITS, top_p=top_p) == expected


def test_top_p_over_a_wide_vocabulary_matches_a_full_sort():
    """Rows whose nucleus lies within the top 256 candidates, within 4,096, and beyond both
    (sorted in full) in one batch."""
    gen = torch.Generator().manual_seed(0)
    flat = torch.randn(3, 5000, generator=gen) * 0.3  # mass spread beyond 256 tokens
    peaked = torch.randn(3, 5000, generator=gen) * 6.0
    even = torch.randn(2, 5000, generator=gen) * 0.01  # beyond 4,096
    logits = torch.cat([flat, peaked, even])
    rows = [row(top_p=0.9) for _ in range(8)]
    out = filter_logits(logits.clone(), rows)
    probs = logits.softmax(dim=1)
    assert int(torch.isfinite(out[6]).sum()) > 4096
    for i in range(8):
        values, order = probs[i].sort(descending=True)
        expected = set(order[(values.cumsum(0) - values) < 0.9].tolist())
        assert set(torch.isfinite(out[i]).nonzero().flatten().tolist()) == expected


def test_min_p_drops_tokens_below_a_share_of_the_best():
    assert kept(LOGITS, min_p=0.3) == [0, 1, 2]


def test_penalties():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    rep = SampleRow(SamplingParams(repetition_penalty=2.0), [0], [1], None)
    assert apply_penalties(logits.clone(), [rep]).tolist() == [[1.0, -4.0, 1.0, 0.5]]
    freq = SampleRow(SamplingParams(frequency_penalty=0.5, presence_penalty=0.25), [], [2, 2], None)
    assert apply_penalties(logits.clone(), [freq]).tolist() == [[2.0, -2.0, -0.25, 0.5]]


def test_greedy_takes_the_argmax_and_reports_its_logprob():
    tokens, logprobs = sample(LOGITS.unsqueeze(0), [row(temperature=0)])
    assert tokens == [0] and logprobs[0] == pytest.approx(math.log(0.5), abs=1e-6)


@pytest.mark.parametrize("temperature", [1e-45, 1e-38, 1e-6])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature):
    """vLLM's rule: below 1e-5 a temperature is 0; logits / 1e-38 would overflow to inf and
    the softmax to NaN."""
    logits = torch.tensor([[3.0, 9.0, 8.5, -1.0]])
    assert SamplingParams(temperature=temperature).greedy
    tokens, logprobs = sample(logits, [row(temperature=temperature, seed=3)])
    assert tokens == [1] and logprobs[0] == pytest.approx(float(logits.log_softmax(1)[0, 1]))
    assert not SamplingParams(temperature=1e-5).greedy


@pytest.mark.parametrize("penalty", [1e-40, 1e-300, 1e300])
def test_an_extreme_repetition_penalty_keeps_every_logit_finite(penalty):
    logits = torch.tensor([[3.0, -9.0, 8.5, -1.0]])
    seen = SampleRow(SamplingParams(repetition_penalty=penalty, temperature=0.5, seed=1),
                     [0, 1], [], torch.Generator().manual_seed(1))
    penalised = apply_penalties(logits.clone(), [seen])
    assert bool(torch.isfinite(penalised).all())
    assert bool(torch.isfinite(filter_logits(penalised, [seen]).softmax(dim=1)).all())
    tokens, _ = sample(logits.clone(), [seen])
    assert tokens == [0 if penalty < 1 else 2]  # a tiny penalty lifts the seen, positive 3.0


def test_draws_follow_the_distribution():
    params = SamplingParams(temperature=1.0, seed=1)
    generator = torch.Generator().manual_seed(1)
    counts = torch.zeros(5)
    for _ in range(4000):
        tokens, _ = sample(LOGITS.unsqueeze(0), [SampleRow(params, [], [], generator)])
        counts[tokens[0]] += 1
    assert torch.allclose(counts / 4000, PROBS, atol=0.03)


def test_slices_of_rows_sample_as_one_batch(monkeypatch):
    """A wide vocabulary is sampled a slice of rows at a time, with the same result for
    greedy, penalised and seeded rows."""
    import pagedchat.engine.sampling.sampler as sampler

    logits = torch.randn(7, 3000, generator=torch.Generator().manual_seed(1)) * 4

    def batch() -> list[SampleRow]:
        return [SampleRow(SamplingParams(temperature=0.0), [1], [2], None),
                SampleRow(SamplingParams(temperature=0.0, repetition_penalty=1.3), [5], [], None),
                *[SampleRow(SamplingParams(temperature=0.8, top_p=0.9, seed=i), [1], [],
                            torch.Generator().manual_seed(i)) for i in range(5)]]

    whole = sample(logits.clone(), batch())
    monkeypatch.setattr(sampler, "SLICE_LOGITS", 2 * 3000)
    assert sample(logits.clone(), batch()) == whole
