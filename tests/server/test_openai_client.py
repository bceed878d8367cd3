"""The official openai client against a live server on the tiny model."""

from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai")

HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(live_server):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0,
                         timeout=60)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat_streamed_equals_chat_whole(client):
    whole = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12,
                                           temperature=0, extra_body={"ignore_eos": True})
    choice = whole.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert whole.usage.completion_tokens == 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 12
    chunks = list(client.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_logprobs(client):
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=5,
                                           temperature=0, logprobs=True, top_logprobs=3,
                                           extra_body={"ignore_eos": True})
    content = reply.choices[0].logprobs.content
    assert len(content) == 5
    assert "".join(item.token for item in content) == reply.choices[0].message.content
    for item in content:
        assert len(item.top_logprobs) == 3
        assert item.top_logprobs[0].token == item.token  # greedy: the most likely
        assert item.top_logprobs[0].logprob == pytest.approx(item.logprob)
        values = [t.logprob for t in item.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert bytes(item.bytes).decode("utf-8", "replace") == item.token


def test_completions_n_seed_and_prompt_list(client):
    kwargs = dict(model="tiny", prompt=["Once upon", "The sky"], max_tokens=6, n=2, seed=7,
                  temperature=1.0, logprobs=2)
    first, again = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    for choice in first.choices:
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
        assert all(len(top) <= 2 for top in lp.top_logprobs)
        assert lp.text_offset == sorted(lp.text_offset)
    assert first.usage.completion_tokens == sum(
        len(c.logprobs.tokens) for c in first.choices)


def test_completions_stream(client):
    whole = client.completions.create(model="tiny", prompt="1, 2, 3,", max_tokens=8,
                                      temperature=0, extra_body={"ignore_eos": True})
    parts = list(client.completions.create(model="tiny", prompt="1, 2, 3,", max_tokens=8,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True}))
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text


def test_logit_bias_and_min_tokens(client, live_server):
    tokenizer = live_server.state.tokenizer
    token = tokenizer.encode(" blue", add_special_tokens=False)[0]
    reply = client.completions.create(model="tiny", prompt="Sky:", max_tokens=3, temperature=0,
                                      logit_bias={str(token): 100})
    assert reply.choices[0].text == tokenizer.decode([token] * 3)
    eos = live_server.state.eos_token_ids[0]
    held = client.completions.create(model="tiny", prompt="Sky:", max_tokens=10, temperature=0,
                                     logit_bias={str(eos): 100},
                                     extra_body={"min_tokens": 4})
    assert held.usage.completion_tokens == 5 and held.choices[0].finish_reason == "stop"


def test_json_schema_output_parses_and_matches(client):
    schema = {"type": "object", "additionalProperties": False, "required": ["color", "ok"],
              "properties": {"color": {"enum": ["red", "green", "blue"]},
                             "ok": {"type": "boolean"}}}
    for seed in range(3):
        reply = client.chat.completions.create(
            model="tiny", messages=HELLO, max_tokens=40, temperature=1.0, seed=seed,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "answer", "schema": schema}})
        value = json.loads(reply.choices[0].message.content)
        assert set(value) == {"color", "ok"}
        assert value["color"] in ("red", "green", "blue") and isinstance(value["ok"], bool)


def test_json_object_is_valid_json_so_far(client):
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=60,
                                           temperature=0, n=2,
                                           response_format={"type": "json_object"})
    for choice in reply.choices:
        text = choice.message.content
        assert text.startswith("{")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)


def test_tokenize_and_detokenize(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        ids = http.post("/tokenize", json={"prompt": "hello world"}).json()
        assert ids["count"] == len(ids["tokens"]) > 0
        text = http.post("/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"]
        assert text.endswith("hello world")
        chat = http.post("/tokenize", json={"messages": HELLO}).json()
        assert chat["count"] > ids["count"]
        assert http.get("/health").json() == {"status": "ok"}


def test_null_fields_take_their_defaults(live_server):
    body = {"messages": HELLO, "max_tokens": 3, "n": None, "stop": None, "logprobs": None,
            "top_logprobs": None, "stream": None, "response_format": None, "seed": None}
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["choices"]) == 1
