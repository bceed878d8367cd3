"""The engine's door: any values a JSON line or an HTTP body can carry either become a
request that runs to its end, or are refused with a RequestError naming the field; and
what fails for one request inside a step ends that request alone."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from pagedchat.engine.errors import RequestError, invalid_text
from pagedchat.engine.sampling_params import SamplingParams

FIELDS = ["n", "best_of", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
          "presence_penalty", "frequency_penalty", "seed", "max_tokens", "stop",
          "stop_token_ids", "ignore_eos", "use_beam_search", "length_penalty",
          "early_stopping", "logprobs", "min_tokens", "logit_bias"]

# what JSON can carry, with the edges that broke the engine before: 2**63, 2**64, NaN
EDGES = [0, 1, -1, 2, 3, 4, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**30,
         10**305, 10**400,
         0.5, 1e-300, 1e300, math.inf, -math.inf, math.nan, True, False, None, "abc", "",
         [], [1], [10**9], ["x"], [""], {}, {"1": 2}, {1: 2.0}, {10**9: 1.0}]
json_values = st.one_of(st.sampled_from(EDGES), st.integers(), st.floats(),
                        st.text(max_size=3), st.lists(st.integers(-2, 300), max_size=3),
                        st.lists(st.text(max_size=2), max_size=2))
small_values = {  # values that keep an accepted request short
    "n": st.integers(1, 3), "max_tokens": st.integers(1, 4), "min_tokens": st.integers(0, 2)}


@st.composite
def sampling_fields(draw) -> dict:
    names = draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=6))
    fields = {}
    for name in names:
        wild = draw(st.booleans()) or name not in small_values
        fields[name] = draw(json_values if wild else small_values[name])
    fields.setdefault("max_tokens", 3)
    return fields


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=sampling_fields())
def test_any_values_run_or_are_refused_naming_their_field(tiny_llm, fields):
    engine = tiny_llm.engine
    try:
        params = SamplingParams(**fields)
        engine.add_request("fuzz", [1, 2, 3, 4], params)
    except RequestError as error:
        assert error.param in (*FIELDS, "prompt"), (fields, error)
        assert error.param in str(error) or error.param in ("n", "max_tokens"), error
        assert not engine.has_unfinished_requests()
        return
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    final = outputs[-1]
    assert final.finished and final.error is None, (fields, final.error)
    assert engine.stats().used_blocks == 0


@pytest.mark.parametrize("fields, param", [
    ({"top_k": 2**63}, "top_k"),
    ({"seed": 2**64}, "seed"),
    ({"seed": "abc"}, "seed"),
    ({"stop": [1]}, "stop"),
    ({"temperature": math.nan}, "temperature"),
    ({"repetition_penalty": math.inf}, "repetition_penalty"),
    ({"n": True}, "n"),
    ({"logit_bias": {"7": 1.0}}, "logit_bias"),
])
def test_values_the_engine_cannot_hold_name_their_field(fields, param):
    with pytest.raises(RequestError) as caught:
        SamplingParams(**fields)
    assert caught.value.param == param and param in str(caught.value)


def test_token_ids_outside_the_vocabulary_are_refused_at_the_door(tiny_llm):
    engine = tiny_llm.engine
    params = SamplingParams(max_tokens=4, min_tokens=1, stop_token_ids=[10**9])
    with pytest.raises(RequestError, match="outside the vocabulary") as caught:
        engine.add_request("far", [1, 2, 3], params)
    assert caught.value.param == "stop_token_ids"
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("value, path, character", [
    ("\ud800", "", 0),  # JSON's "\ud800"
    ("bad \udcff byte", "", 4),  # a byte 0xff a command line could not decode
    ({"prompt": ["ok", "x\udfff"]}, "prompt.1", 1),
    ([{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}], "0.content.0.text", 0),
])
def test_lone_surrogates_are_found_by_their_path(value, path, character):
    where, message = invalid_text(value)
    assert where == path and f"at character {character}" in message
    assert message.startswith(f"{path}: ") if path else message.startswith("the text")


def test_text_that_is_unicode_passes():
    assert invalid_text({"prompt": ["ok \U0001f600", 5, None], "n": {"é": "ü"}}) is None


def test_any_depth_is_searched():
    deep: object = "\ud800"
    for _ in range(20_000):  # far past Python's recursion limit
        deep = [deep]
    assert invalid_text({"x": deep})[0] == "x" + ".0" * 20_000


def test_text_no_tokenizer_encodes_is_refused_at_the_door(tiny_llm):
    with pytest.raises(RequestError, match="lone surrogate U\\+D800 at character 3") as caught:
        tiny_llm.engine.add_request("surrogate", "abc\ud800", SamplingParams(max_tokens=2))
    assert caught.value.param == "prompt"
    with pytest.raises(RequestError, match="messages.0.content: the text is not valid") as chat:
        tiny_llm.chat([{"role": "user", "content": "\udcff"}], SamplingParams(max_tokens=2))
    assert chat.value.param == "messages"
    assert not tiny_llm.engine.has_unfinished_requests()


class FailsAfter:
    """A logits processor that raises once the output holds ``n`` tokens, as a grammar
    asked for a token past its end does."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, history: list[int], row: torch.Tensor) -> torch.Tensor:
        if len(history) >= self.n:
            raise RuntimeError("the matcher has terminated")
        return row


@pytest.mark.parametrize("fails_after", [0, 2])
def test_a_request_that_fails_in_a_step_ends_alone(tiny_llm, fails_after):
    engine = tiny_llm.engine
    prompts = {f"ok-{i}": [5 + i, 6, 7, 8] for i in range(3)}
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)

    def run(with_failing: bool) -> dict:
        for rid, prompt in prompts.items():
            engine.add_request(rid, prompt, sampled if rid == "ok-1" else greedy)
        if with_failing:
            engine.add_request("bad", [9, 9, 9], SamplingParams(
                temperature=0, max_tokens=6, ignore_eos=True,
                logits_processors=[FailsAfter(fails_after)]))
        finals = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finals[out.request_id] = out
        return finals

    alone = run(with_failing=False)
    beside = run(with_failing=True)
    failed = beside.pop("bad")
    assert failed.error is not None and "matcher has terminated" in failed.error
    assert [o.finish_reason for o in failed.outputs] == ["error"]
    assert len(failed.outputs[0].token_ids) == fails_after
    for rid, out in alone.items():
        assert beside[rid].error is None
        assert beside[rid].outputs[0].token_ids == out.outputs[0].token_ids
    stats = engine.stats()
    assert stats.used_blocks == 0


def test_a_step_that_computes_nan_fails_its_requests_and_the_engine_goes_on(tiny_model_dir,
                                                                          monkeypatch):
    """Hidden states that are not finite (corrupt weights) make no token: that step's
    requests end with an error naming the cause, their blocks freed; the next request runs,
    also one whose step samples a kept row beside the failed prompts' kept NaN rows. An engine
    of its own: the shared one would keep those rows."""
    from pagedchat import LLM

    engine = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16).engine
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    model = engine.runner.model
    monkeypatch.setattr(model, "forward", lambda *args: type(model).forward(model, *args) *
                        float("nan"))
    engine.add_request("nan-greedy", list(range(3, 19)), greedy)  # whole blocks: kept
    engine.add_request("nan-sampled", list(range(20, 36)),
                       SamplingParams(temperature=1.0, max_tokens=4))
    failed = {out.request_id: out for out in engine.step()}
    assert set(failed) == {"nan-greedy", "nan-sampled"}
    for out in failed.values():
        assert out.finished and [o.finish_reason for o in out.outputs] == ["error"]
        assert "computed NaN or infinity in this step" in out.error
    assert not engine.has_unfinished_requests() and engine.stats().used_blocks == 0
    monkeypatch.undo()
    for request_id in ("after", "after-again"):  # the second samples its prompt's kept row
        engine.add_request(request_id, list(range(40, 56)), greedy)
        while engine.has_unfinished_requests():
            [after] = engine.step()
        assert after.error is None and len(after.outputs[0].token_ids) == 4


@pytest.mark.parametrize("speculative", [None, "ngram"])
def test_a_row_that_computes_nan_fails_its_request_alone(tiny_model_dir, monkeypatch,
                                                         speculative):
    """A request whose sampled row is not finite (here: every row of token 5 made NaN) ends
    with an error naming the cause, its blocks freed, also where it would fork n samples or
    where the NaN row is a drafted one; the requests in its steps go on, their greedy tokens
    those of a run without it."""
    from pagedchat import LLM

    engine = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16,
                 speculative=speculative).engine
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    good = {"good-long": list(range(40, 59)), "good-short": [60, 61, 62]}

    def run() -> dict:
        outputs = {}
        while engine.has_unfinished_requests():
            outputs.update((out.request_id, out) for out in engine.step() if out.finished)
        return outputs

    for request_id, prompt in good.items():
        engine.add_request(request_id, prompt, greedy)
    alone = {request_id: out.outputs[0].token_ids for request_id, out in run().items()}
    model = engine.runner.model
    monkeypatch.setattr(model, "forward", lambda input_ids, *args: type(model).forward(
        model, input_ids, *args).masked_fill((input_ids == 5).unsqueeze(-1), float("nan")))
    if speculative:  # a draft of token 5 for the request that starts with 7: a drafted row
        proposer = engine.scheduler.proposer
        propose = proposer.propose
        monkeypatch.setattr(proposer, "propose", lambda seq, limit: [5, 9] if seq.token_ids[0] == 7
                            and seq.num_output_tokens else propose(seq, limit))
    bad = {"bad-greedy": ([3, 4, 5], greedy),
           "bad-forked": ([6, 5], SamplingParams(temperature=1.0, n=2, max_tokens=6)),
           "bad-drafted": ([7, 8, 9] if speculative else [7, 8, 5], greedy)}
    for request_id, (prompt, params) in bad.items():
        engine.add_request(request_id, prompt, params)
    for request_id, prompt in good.items():
        engine.add_request(request_id, prompt, greedy)
    outputs = run()
    for request_id in bad:
        assert [o.finish_reason for o in outputs[request_id].outputs] == ["error"]
        assert "computed NaN or infinity in this step" in outputs[request_id].error
    for request_id, tokens in alone.items():
        assert outputs[request_id].error is None
        assert outputs[request_id].outputs[0].token_ids == tokens
    assert engine.stats().used_blocks == 0


@pytest.mark.parametrize("fields", [
    {"temperature": 2**63}, {"temperature": 1e-300}, {"repetition_penalty": 10**300},
    {"top_k": 2**62, "temperature": 1}, {"logit_bias": {5: 2**6}, "temperature": 1},
])
def test_large_but_valid_values_run_to_the_end(tiny_llm, fields):
    engine = tiny_llm.engine
    engine.add_request("edge", [1, 2, 3], SamplingParams(max_tokens=3, **fields))
    while engine.has_unfinished_requests():
        outputs = engine.step()
    assert outputs[-1].finished and outputs[-1].error is None
    assert engine.stats().used_blocks == 0
