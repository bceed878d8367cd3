"""llama.cpp as a peer: its request and token plumbing on the tiny random GGUF.

llama-cpp-python comes with the optional ``[peers]`` extra; without it these tests are
skipped (the peer's own error message is tested either way)."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from pagedchat.cli import app
from pagedchat_lab.sharegpt import Request

runner = CliRunner()


def test_missing_bindings_say_how_to_install(monkeypatch):
    from pagedchat_lab.llamacpp import bindings

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    with pytest.raises(ValueError, match=r"pagedchat\[peers\]"):
        bindings()


def test_an_hf_folder_is_refused_with_a_clear_line(tiny_model_dir):
    from pagedchat_lab.llamacpp import gguf_of

    with pytest.raises(ValueError, match="llama.cpp runs on a GGUF file"):
        gguf_of(str(tiny_model_dir))


def test_an_unknown_peer_is_named(tiny_gguf):
    result = runner.invoke(app, ["bench", "latency", "--model", str(tiny_gguf), "--compare",
                                 "vllm", "--no-loads"])
    assert result.exit_code == 1
    assert "unknown engine 'vllm'" in result.output


llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python (the optional [peers] extra) is not installed")


@pytest.fixture(scope="module")
def llama(tiny_gguf):
    from pagedchat_lab.llamacpp import LlamaCpp

    return LlamaCpp(tiny_gguf, threads=1)


@pytest.fixture(scope="module")
def prompts(tiny_gguf) -> list[list[int]]:
    from transformers import AutoTokenizer

    from pagedchat.engine.loading.loader import prepare_model

    tokenizer = AutoTokenizer.from_pretrained(prepare_model(tiny_gguf).folder)
    texts = ["The weather in Paris is", "def fibonacci(n):", "Paging KV memory",
             "Once upon a time, a block table", "a", "Why is the sky blue? " * 12]
    return [tokenizer.encode(text) for text in texts]


def test_single_stream_is_greedy_and_repeatable(llama, prompts):
    tokens, times, start = llama.greedy(prompts[0], 6)
    assert len(tokens) == 6 and len(times) == 6
    assert start <= times[0] <= times[-1]
    assert llama.greedy(prompts[0], 6)[0] == tokens  # the context is emptied in between
    figures = llama(prompts[1], 4)
    assert figures["ttft_ms"] > 0 and figures["decode_tokens_per_s"] > 0


def _greedy_with_margins(llama, ids: list[int], tokens: int) -> tuple[list[int], list[float]]:
    """One sequence alone, with each step's gap between its best two logits."""
    import numpy as np

    from pagedchat_lab.llamacpp import _Batch

    llama.context(1, 2048)
    batch, found, margins = _Batch(llama.lib, len(ids)), [], []
    batch.add(ids, 0, 0, True)
    for step in range(tokens):
        batch.native.n_tokens, batch.size = batch.size, 0
        assert llama.lib.llama_decode(llama.ctx, batch.native) == 0
        logits = np.ctypeslib.as_array(llama.lib.llama_get_logits(llama.ctx),
                                       shape=(llama.vocab,))
        second, first = np.sort(logits)[-2:]
        found.append(int(logits.argmax()))
        margins.append(float(first - second))
        batch.add(found[-1:], len(ids) + step, 0, True)
    return found, margins


def _assert_as_alone(llama, requests: list[Request], outputs: list[list[int]]) -> None:
    """Each request's tokens are those it makes alone, up to its first near-tie step; at
    least half of all tokens are compared."""
    compared = 0
    for request, tokens in zip(requests, outputs):
        alone, margins = _greedy_with_margins(llama, request.prompt_ids, request.output_len)
        sure = next((i for i, m in enumerate(margins) if m < 0.1), len(margins))
        assert len(tokens) == request.output_len
        assert tokens[:sure] == alone[:sure]
        compared += sure
    assert compared >= sum(r.output_len for r in requests) // 2


@pytest.mark.parametrize("n_seq", [1, 2, 4])
def test_batched_run_gives_each_request_its_own_greedy_tokens(llama, prompts, n_seq):
    """More requests than sequences, of different lengths: every request gets exactly its
    output length, and the tokens a sequence makes among others are the ones it makes
    alone (slots, positions, and the order of logits rows all line up). llama.cpp's
    arithmetic depends on the batch it runs in, so a step whose best two logits are within
    a tenth of a logit of each other alone may go either way: tokens are compared up to the
    first such step."""
    from pagedchat_lab.llamacpp import LlamaCppBatched

    requests = [Request(str(i), ids, 3 + i % 4) for i, ids in enumerate(prompts)]
    peer = LlamaCppBatched(llama, n_seq=n_seq, kv_tokens=256)
    done = []
    results = peer.run(requests, [0.0] * len(requests), done.append)
    assert len(done) == len(requests)
    assert [r.output_len for r in results] == [r.output_len for r in requests]
    assert [r.prompt_len for r in results] == [r.prompt_len for r in requests]
    _assert_as_alone(llama, requests, peer.outputs)


def test_a_pool_smaller_than_the_batch_only_delays_requests(llama, prompts):
    from pagedchat_lab.llamacpp import LlamaCppBatched

    requests = [Request(str(i), ids, 4) for i, ids in enumerate(prompts[:4])]
    small = LlamaCppBatched(llama, n_seq=4, kv_tokens=24)  # one or two requests at a time
    results = small.run(requests, [0.0] * 4, lambda k: None)
    assert [r.output_len for r in results] == [4] * 4
    _assert_as_alone(llama, requests, small.outputs)


def test_a_request_longer_than_the_cells_is_refused(llama, prompts):
    from pagedchat_lab.llamacpp import LlamaCppBatched

    peer = LlamaCppBatched(llama, n_seq=2, kv_tokens=16)
    with pytest.raises(ValueError, match="does not fit llama.cpp's 16 KV cells"):
        peer.run([Request("long", prompts[-1] * 20, 8)], [0.0], lambda k: None)


def test_latency_compares_llama_cpp_on_the_same_file(tiny_gguf, tmp_path,
                                                    small_copy_bandwidth):
    out = tmp_path / "l.json"
    result = runner.invoke(app, ["bench", "latency", "--model", str(tiny_gguf), "--compare",
                                 "llama.cpp", "--rounds", "2", "--max-tokens", "4",
                                 "--prompt-len", "64", "--no-loads", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data["engines"]) == {"pagedchat", "llama.cpp"}
    theirs = data["engines"]["llama.cpp"]
    assert len(theirs["rounds"]) == 2
    assert theirs["bandwidth_share"] > 0 and theirs["bytes_per_token_mb"] > 0
    assert data["memory_speed"]["copy_bandwidth_gb_s"] > 0
    check = data["llama.cpp"]["tokens"]
    assert check["prompts"] == 4 and 0 <= check["first_token_agreement"] <= 1
    assert "AVX" in data["llama.cpp"]["system_info"] or "NEON" in data["llama.cpp"][
        "system_info"]


def test_throughput_keeps_llama_cpp_best_sequence_count(tiny_gguf, tmp_path):
    out = tmp_path / "t.json"
    result = runner.invoke(app, ["bench", "throughput", "--model", str(tiny_gguf), "-n", "5",
                                 "--max-tokens", "4", "--kv-blocks", "64", "--compare",
                                 "llama.cpp", "--llamacpp-seqs", "1,4", "--no-ceiling",
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    ours, theirs = data["engines"]["pagedchat"], data["engines"]["llama.cpp"]
    assert (theirs["prompt_tokens"], theirs["output_tokens"]) == (
        ours["prompt_tokens"], ours["output_tokens"])
    assert theirs["sequences"] in (1, 4)
    labels = [row["engine"] for row in data["runs"]]
    assert labels == ["pagedchat", "llama.cpp-s1", "llama.cpp-s4"]
    best = max(data["runs"][1:], key=lambda row: row["output_tokens_per_s"])
    assert best["engine"] == f"llama.cpp-s{theirs['sequences']}"
    assert "AVX" in data["llama.cpp"]["system_info"] or "NEON" in data["llama.cpp"][
        "system_info"]
