"""Bad requests of each kind get OpenAI's error shape, the right status, and a message
naming the problem; the server goes on serving."""

from __future__ import annotations

import httpx
import pytest

HELLO = [{"role": "user", "content": "hi"}]


def post(url: str, path: str, body, headers: dict | None = None) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=30) as http:
        if isinstance(body, str):
            return http.post(path, content=body, headers={"content-type": "application/json",
                                                          **(headers or {})})
        return http.post(path, json=body, headers=headers)


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize("body, words", [
    ({"messages": HELLO, "temperature": -1}, "temperature"),
    ({"messages": HELLO, "n": 0}, "n"),
    ({"messages": []}, "messages"),
    ({"max_tokens": 4}, "messages"),
    ({"messages": HELLO, "top_logprobs": 2}, "top_logprobs needs logprobs"),
    ({"messages": HELLO, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": HELLO, "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"messages": HELLO, "logit_bias": {"99999999": 1}}, "outside the vocabulary"),
    ({"messages": HELLO, "min_tokens": 9, "max_tokens": 4}, "min_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "only text parts"),
    ({"messages": HELLO, "tools": [{"type": "function"}]}, "tools"),
    ({"messages": HELLO, "response_format": {"type": "json_schema"}}, "needs a schema"),
    ({"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "no-such-type"}}}}, "schema"),
])
def test_bad_chat_parameters_are_400(live_server, body, words):
    error = error_of(post(live_server.url, "/v1/chat/completions", body), 400)
    assert words in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("body, words", [
    ({"prompt": "hi", "echo": True}, "echo"),
    ({"prompt": "hi", "n": 2, "best_of": 1}, "best_of"),
    ({"prompt": "hi", "n": 1, "best_of": 2, "stream": True}, "cannot stream"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[-5, 3]]}, "prompt token ids"),
])
def test_bad_completion_parameters_are_400(live_server, body, words):
    assert words in error_of(post(live_server.url, "/v1/completions", body), 400)["message"]


def test_malformed_json_is_400(live_server):
    error = error_of(post(live_server.url, "/v1/chat/completions", "{not json"), 400)
    assert "not valid JSON" in error["message"]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", r'{"prompt": "abc\ud800"}', "prompt"),
    ("/v1/completions", r'{"prompt": ["ok", "\udfff"], "max_tokens": 2}', "prompt.1"),
    ("/v1/completions", r'{"prompt": "ok", "stop": ["\udc00"]}', "stop.0"),
    ("/v1/chat/completions", r'{"messages": [{"role": "user", "content": [{"type": "text", '
                             r'"text": "\ud800"}]}]}', "messages.0.content.0.text"),
    ("/tokenize", r'{"prompt": "\udbff"}', "prompt"),
])
def test_text_that_is_not_unicode_is_400_naming_its_field(live_server, path, body, param):
    """JSON's escapes can carry a lone UTF-16 surrogate, which no tokenizer encodes."""
    error = error_of(post(live_server.url, path, body), 400)
    assert error["param"] == param and "lone surrogate" in error["message"]
    pair = post(live_server.url, "/v1/completions", r'{"prompt": "\ud83d\ude00", "max_tokens": 1}')
    assert pair.status_code == 200, pair.text  # an escaped pair is one character


@pytest.mark.parametrize("field, value", [
    ("stream", "yes"), ("max_tokens", True), ("max_tokens", "8"), ("max_tokens", 8.0),
    ("n", "2"), ("temperature", "0.5"), ("temperature", True), ("logprobs", "on"),
    ("ignore_eos", 1), ("seed", 1.5), ("stop_token_ids", ["2"])])
def test_a_value_of_the_wrong_json_type_is_400_not_converted(live_server, field, value):
    error = error_of(post(live_server.url, "/v1/chat/completions",
                          {"messages": HELLO, "max_tokens": 2, field: value}), 400)
    assert error["param"].split(".")[0] == field and error["message"].startswith(field)


@pytest.mark.parametrize("path, body, param, members", [
    ("/v1/completions", {"prompt": "hi", "stop": [1, 2]}, "stop", "str, list[str]"),
    ("/v1/completions", {"prompt": 5}, "prompt",
     "str, list[str], list[int], list[list[int]]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]},
     "messages.0.content", "str, list[dict[str,any]]"),
])
def test_a_value_fitting_none_of_a_fields_shapes_names_the_field_and_its_shapes(
        live_server, path, body, param, members):
    error = error_of(post(live_server.url, path, body), 400)
    assert error["param"] == param
    assert error["message"] == f"{param}: should be one of {members}"


@pytest.mark.parametrize("content, headers", [
    ("messages=hi", {"content-type": "application/x-www-form-urlencoded"}),
    ("", {"content-type": "application/json"}), ("[1, 2]", {"content-type": "application/json"}),
])
def test_a_body_that_is_no_json_object_is_400_saying_so(live_server, content, headers):
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        error = error_of(http.post("/v1/chat/completions", content=content, headers=headers), 400)
    assert error["message"] == ("the request body must be a JSON object (Content-Type: "
                                "application/json)") and error["param"] is None


def test_one_model_is_retrieved_by_its_name_as_the_sdk_asks(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        listed = http.get("/v1/models").json()["data"]
        for card in listed:
            assert http.get(f"/v1/models/{card['id']}").json() == card
        error = error_of(http.get("/v1/models/gpt-9"), 404)
    assert error["code"] == "model_not_found" and "gpt-9" in error["message"]


def test_stream_options_without_stream_is_400(live_server):
    error = error_of(post(live_server.url, "/v1/chat/completions", {
        "messages": HELLO, "max_tokens": 2, "stream_options": {"include_usage": True}}), 400)
    assert error["param"] == "stream_options" and "stream: true" in error["message"]


def test_a_wrong_method_is_405_in_openais_shape_and_health_answers_head(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        assert error_of(http.get("/v1/chat/completions"), 405)["type"] == "invalid_request_error"
        assert http.head("/health").status_code == 200


def test_unknown_model_is_404(live_server):
    error = error_of(post(live_server.url, "/v1/chat/completions",
                          {"model": "gpt-9", "messages": HELLO}), 404)
    assert "gpt-9" in error["message"] and error["code"] == "model_not_found"


def test_prompt_longer_than_the_context_is_413(live_server):
    words = " ".join(["token"] * 1100)  # the tiny model's context is 1024
    error = error_of(post(live_server.url, "/v1/completions", {"prompt": words}), 413)
    assert "context" in error["message"] and error["code"] == "context_length_exceeded"


def test_prompt_larger_than_the_pool_is_413(keyed_server):
    words = " ".join(["token"] * 200)  # the pool holds 8 blocks of 16 tokens
    error = error_of(post(keyed_server.url, "/v1/completions", {"prompt": words},
                          {"Authorization": "Bearer sesame"}), 413)
    assert "KV pool" in error["message"]


def test_wrong_or_missing_key_is_401(keyed_server):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        error = error_of(post(keyed_server.url, "/v1/completions", {"prompt": "hi"}, headers),
                         401)
        assert error["type"] == "authentication_error"
    good = post(keyed_server.url, "/v1/completions", {"prompt": "hi", "max_tokens": 2},
                {"Authorization": "Bearer sesame"})
    assert good.status_code == 200


def test_draining_server_is_503_and_unhealthy(live_server):
    state = live_server.state
    state.draining = True
    try:
        error_of(post(live_server.url, "/v1/completions", {"prompt": "hi"}), 503)
        with httpx.Client(base_url=live_server.url, timeout=30) as http:
            assert http.get("/health").status_code == 503
    finally:
        state.draining = False
    assert post(live_server.url, "/v1/completions",
                {"prompt": "hi", "max_tokens": 2}).status_code == 200
