"""Argmax-only requests (greedy, nothing else asked of the logits): their tokens come from
the greedy head's screen where the model has one, side by side with requests that need the
whole logits, and are the tokens the whole head gives."""

from __future__ import annotations

import pytest

from pagedchat import LLM, SamplingParams
from tests.engine.test_llm_engine import _prompts

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
ROWS = 8


def force_screen(head, monkeypatch) -> list[int]:
    """Have a model's greedy head screen every batch (faster here or not); the list
    returned gets the row count of each call."""
    monkeypatch.setattr(head.way, "screen", lambda rows: True)
    calls = []
    tokens = head.tokens

    def counted(x, out=None):
        calls.append(len(x))
        return tokens(x, out)

    monkeypatch.setattr(head, "tokens", counted)
    return calls


def _whole_head(llm: LLM) -> LLM:
    llm.engine.runner.model.greedy_head = None
    return llm


@pytest.mark.parametrize("options", [dict(num_kv_blocks=128),
                                     dict(block_size=4, num_kv_blocks=64)],
                         ids=["batched", "preempted"])
def test_screened_tokens_are_the_whole_heads(tiny_model_dir, options, monkeypatch):
    # short prompts: all run at once, then outgrow the small pool
    prompts = [prompt[:16] for prompt in _prompts(ROWS + 4, seed=8)]
    llm = LLM(model=str(tiny_model_dir), weights="q8_0", **options)
    calls = force_screen(llm.engine.runner.model.greedy_head, monkeypatch)
    outputs = llm.generate(prompts, GREEDY)
    assert calls and max(calls) >= ROWS  # the screen ran, on whole batches
    whole = _whole_head(LLM(model=str(tiny_model_dir), weights="q8_0", **options))
    expected = whole.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == \
        [o.outputs[0].token_ids for o in expected]
    assert all(o.outputs[0].cumulative_logprob is None for o in outputs)
    if "block_size" in options:
        assert llm.engine.stats().preemptions > 0


def test_argmax_rows_beside_rows_that_need_the_logits(tiny_model_dir, monkeypatch):
    """One batch: argmax-only rows, seeded samples, greedy with logprobs, a penalty and a
    beam search; each answer is what it is with the whole head."""
    prompts = _prompts(ROWS + 6, seed=9)
    params = [GREEDY] * ROWS + [
        SamplingParams(temperature=0.8, seed=1, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=5, seed=2, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0, logprobs=2, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0, min_tokens=4, max_tokens=12),
        SamplingParams(n=1, best_of=2, use_beam_search=True, temperature=0, max_tokens=6,
                       ignore_eos=True),
    ]
    llm = LLM(model=str(tiny_model_dir), weights="q8_0", num_kv_blocks=256)
    calls = force_screen(llm.engine.runner.model.greedy_head, monkeypatch)
    ours = llm.generate(prompts, params)
    assert calls and max(calls) >= ROWS
    whole = _whole_head(LLM(model=str(tiny_model_dir), weights="q8_0", num_kv_blocks=256))
    expected = whole.generate(prompts, params)
    for mine, theirs in zip(ours, expected, strict=True):
        assert mine.outputs[0].token_ids == theirs.outputs[0].token_ids
        assert mine.outputs[0].cumulative_logprob == theirs.outputs[0].cumulative_logprob
    logprob_row = ours[ROWS + 2].outputs[0]
    # two float32 reductions of the same logits (the sampler's and log_softmax)
    assert logprob_row.cumulative_logprob == pytest.approx(
        sum(entry[token].logprob for token, entry in zip(logprob_row.token_ids,
                                                         logprob_row.logprobs, strict=True)),
        abs=1e-3)


def test_only_argmax_only_requests_leave_cumulative_logprob_out(tiny_llm):
    asks = {
        "argmax": (GREEDY, True),
        "logprobs": (SamplingParams(temperature=0, logprobs=0, max_tokens=4), False),
        "sampled": (SamplingParams(temperature=1.0, seed=3, max_tokens=4), False),
        "penalty": (SamplingParams(temperature=0, presence_penalty=0.5, max_tokens=4), False),
        "best_of": (SamplingParams(n=1, best_of=2, temperature=0.5, seed=4, max_tokens=4),
                    False),
    }
    for name, (params, argmax_only) in asks.items():
        assert params.argmax_only is argmax_only, name
        out = tiny_llm.generate([[5, 6, 7]], params)[0].outputs[0]
        assert (out.cumulative_logprob is None) is argmax_only, name
        if not argmax_only:
            assert out.cumulative_logprob <= 0
