"""`pagedchat bench ...` end to end on the tiny random model (small numbers, real engines)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pagedchat.cli import app

runner = CliRunner()


def bench(*args: str):
    return runner.invoke(app, ["bench", *args])


@pytest.fixture(scope="module")
def tiny(tiny_model_dir) -> list[str]:
    return ["--model", str(tiny_model_dir)]


def test_throughput_against_both_peers(tiny, tmp_path):
    out = tmp_path / "t.json"
    result = bench("throughput", *tiny, "-n", "3", "--max-tokens", "4", "--kv-blocks", "64",
                   "--compare", "hf-generate,hf-continuous", "--hf-batch-size", "2",
                   "--hf-max-requests", "1,3", "--no-ceiling", "--json", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["metadata"]["num_kv_blocks"] == 64
    engines = data["engines"]
    assert set(engines) == {"pagedchat", "hf-generate", "hf-continuous"}
    # the same requests, so the same token counts, for every engine
    assert len({(e["prompt_tokens"], e["output_tokens"]) for e in engines.values()}) == 1
    assert engines["pagedchat"]["output_tokens"] == 12
    assert engines["hf-generate"]["batch_size"] == 2
    lines = [line for line in result.stdout.splitlines() if line.startswith("throughput ")]
    assert [line.split()[1] for line in lines] == [
        "engine=pagedchat", "engine=hf-generate-b2", "engine=hf-continuous-r1",
        "engine=hf-continuous-r3"]
    # each request limit is a run of its own; the JSON keeps the faster
    speeds = {int(line.split()[1].rsplit("-r", 1)[1]): float(line.split()[3].split("=")[1])
              for line in lines[2:]}
    best = max(speeds, key=speeds.get)
    assert engines["hf-continuous"]["max_requests"] == best
    # the line prints 6 significant digits
    assert engines["hf-continuous"]["output_tokens_per_s"] == pytest.approx(speeds[best],
                                                                           rel=1e-5)
    assert "pagedchat_ratio=1 " in lines[0] + " "


def test_throughput_against_itself_in_another_dtype_in_rounds(tiny, tmp_path):
    """pagedchat in float32 as the peer of a bfloat16 run, both run twice in turn: the
    ratio is the median of the two rounds' ratios, each engine shows its median run, and
    a later round starts cold (no prefix cached by the one before)."""
    out = tmp_path / "t.json"
    result = bench("throughput", *tiny, "-n", "4", "--max-tokens", "3", "--kv-blocks", "64",
                   "--dtype", "bfloat16", "--compare", "pagedchat-float32", "--rounds", "2",
                   "--no-ceiling", "--json", str(out))
    assert result.exit_code == 0, result.output
    engines = json.loads(out.read_text())["engines"]
    assert set(engines) == {"pagedchat", "pagedchat-float32"}
    ours, theirs = engines["pagedchat"], engines["pagedchat-float32"]
    assert len(ours["rounds_output_tokens_per_s"]) == len(theirs["rounds_output_tokens_per_s"]) == 2
    assert ours["output_tokens_per_s"] == min(ours["rounds_output_tokens_per_s"])
    ratios = [a / b for a, b in zip(ours["rounds_output_tokens_per_s"],
                                    theirs["rounds_output_tokens_per_s"], strict=True)]
    assert theirs["pagedchat_ratio"] == pytest.approx(sum(ratios) / 2)
    assert ours["cached_tokens"] == theirs["cached_tokens"] == 0
    lines = [line for line in result.stdout.splitlines() if line.startswith("throughput ")]
    assert [line.split()[1] for line in lines] == ["engine=pagedchat",
                                                   "engine=pagedchat-float32"]
    assert "median of 2 rounds" in result.output and "last in odd ones" in result.output


def test_latency_in_rounds(tiny, tmp_path, small_copy_bandwidth):
    """Both engines timed twice in turn: each figure is the median of its rounds, each
    ratio the median of the rounds' own ratios."""
    out = tmp_path / "l.json"
    result = bench("latency", *tiny, "--max-tokens", "4", "--prompt-len", "48", "--no-loads",
                   "--rounds", "2", "--json", str(out))
    assert result.exit_code == 0, result.output
    engines = json.loads(out.read_text())["engines"]
    assert set(engines) == {"pagedchat", "hf-generate"}
    ours, theirs = engines["pagedchat"], engines["hf-generate"]
    assert len(ours["rounds"]) == len(theirs["rounds"]) == 2
    for figure in ("decode_tokens_per_s", "ttft_ms"):
        for engine in (ours, theirs):
            assert engine[figure] == pytest.approx(
                sum(r[figure] for r in engine["rounds"]) / 2)
    decode = [m["decode_tokens_per_s"] / t["decode_tokens_per_s"]
              for m, t in zip(ours["rounds"], theirs["rounds"], strict=True)]
    ttft = [t["ttft_ms"] / m["ttft_ms"] for m, t in zip(ours["rounds"], theirs["rounds"],
                                                          strict=True)]
    assert theirs["decode_ratio"] == pytest.approx(sum(decode) / 2)
    assert theirs["ttft_ratio"] == pytest.approx(sum(ttft) / 2)
    assert ours["decode_ratio"] == ours["ttft_ratio"] == 1
    lines = [line for line in result.stdout.splitlines() if line.startswith("latency ")]
    assert [line.split()[1] for line in lines] == ["engine=pagedchat", "engine=hf-generate"]
    assert "medians of 2 rounds" in result.output


def test_unknown_peer_is_a_usage_error(tiny):
    result = bench("throughput", *tiny, "--compare", "vllm")
    assert result.exit_code == 2
    assert "unknown engine 'vllm'" in result.output
    assert "pagedchat-float32" in result.output  # the choices are listed


def test_bad_sizes_are_usage_errors(tiny):
    for command, option, value in [("throughput", "--hf-batch-size", "0"),
                                   ("throughput", "--hf-max-requests", "1.5"),
                                   ("throughput", "--hf-max-requests", "many"),
                                   ("parallel", "--sizes", "1,three")]:
        result = bench(command, *tiny, option, value)
        assert result.exit_code == 2, (option, value)
        message = " ".join(result.output.replace("│", " ").split())  # unwrap the error box
        assert f"Invalid value for '{option}'" in message and "whole numbers" in message


def test_bad_rate_and_dtype_are_usage_errors(tiny):
    assert bench("serve", *tiny, "--rate", "0").exit_code == 2
    assert bench("serve", *tiny, "--rate", "fast").exit_code == 2
    assert bench("throughput", *tiny, "--dtype", "int3").exit_code == 2


def test_missing_model_is_one_clear_line(tmp_path):
    result = bench("throughput", "--model", str(tmp_path / "nope"), "-n", "1")
    assert result.exit_code == 1
    assert "no such file or folder" in result.output


def test_serve_writes_latencies_and_the_plot(tiny, tmp_path):
    plot, out = tmp_path / "serve.png", tmp_path / "s.json"
    result = bench("serve", *tiny, "-n", "3", "--max-tokens", "3", "--kv-blocks", "64",
                   "--rate", "20,inf", "--compare", "hf-generate,hf-continuous",
                   "--hf-batch-size", "2", "--plot", str(plot), "--json", str(out))
    assert result.exit_code == 0, result.output
    engines = json.loads(out.read_text())["engines"]
    assert set(engines) == {"pagedchat", "hf-generate", "hf-continuous"}
    for runs in engines.values():
        assert [r["request_rate"] for r in runs] == [20.0, float("inf")]
        for r in runs:
            assert r["output_tokens"] == 9
            assert r["ttft_ms"]["mean"] <= r["e2e_ms"]["mean"]
            assert r["normalized_latency_s_per_token"] > 0
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_memory_breakdown(tiny, tmp_path):
    out = tmp_path / "m.json"
    result = bench("memory", *tiny, "-n", "6", "--max-tokens", "8", "--kv-blocks", "64",
                   "--max-len", "512", "--plot", str(tmp_path / "m.png"), "--json", str(out))
    assert result.exit_code == 0, result.output
    shares = json.loads(out.read_text())["engines"]
    assert set(shares) == {"pagedchat", "max-length", "power-of-two", "oracle"}
    assert shares["pagedchat"]["reserved"] == 0
    assert shares["oracle"]["internal_fragmentation"] == 0


def test_prefix_caching_on_and_off(tiny, tmp_path):
    out = tmp_path / "p.json"
    result = bench("prefix", *tiny, "-n", "3", "--max-tokens", "2", "--shots", "1",
                   "--kv-blocks", "128", "--json", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["engines"]["caching_off"]["cached_tokens"] == 0
    # the 2nd and 3rd requests find the prefix's full blocks in the cache
    assert data["engines"]["caching_on"]["cached_tokens"] >= 2 * (data["prefix_tokens"] // 16) * 16


def test_blocksize_and_preemption(tiny, tmp_path):
    out = tmp_path / "b.json"
    result = bench("blocksize", *tiny, "-n", "2", "--max-tokens", "3", "--sizes", "8,32",
                   "--kv-memory", "1MiB", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert set(json.loads(out.read_text())["engines"]["pagedchat"]) == {"8", "32"}
    out = tmp_path / "p.json"
    result = bench("preemption", *tiny, "-n", "4", "--max-tokens", "16", "--kv-blocks", "20",
                   "--block-size", "8", "--json", str(out))
    assert result.exit_code == 0, result.output
    modes = json.loads(out.read_text())["engines"]
    assert modes["recompute"]["output_tokens"] == modes["swap"]["output_tokens"]
    assert modes["recompute"]["preemptions"] > 0 and modes["swap"]["preemptions"] > 0
    assert modes["recompute"]["swapped_out_blocks"] == 0 < modes["swap"]["swapped_out_blocks"]


def test_chatbot_runs_multi_turn_requests(tiny, tmp_path):
    out = tmp_path / "c.json"
    result = bench("chatbot", *tiny, "-n", "3", "--max-tokens", "3", "--context", "256",
                   "--kv-blocks", "64", "--rate", "inf", "--plot", str(tmp_path / "c.png"),
                   "--json", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["engines"]["pagedchat"][0]["requests"] == 3


def test_parallel_reports_bytes_per_token_for_each_size(tiny_tp_model_dir, tmp_path):
    out = tmp_path / "p.json"
    result = bench("parallel", "--model", str(tiny_tp_model_dir), "-n", "3", "--max-tokens", "4",
                   "--kv-blocks", "64", "--sizes", "1,2", "--json", str(out))
    assert result.exit_code == 0, result.output
    engines = json.loads(out.read_text())["engines"]
    one, two = engines["pagedchat-tp1"], engines["pagedchat-tp2"]
    assert one["output_tokens"] == two["output_tokens"] == 12
    assert one["all_reduce_bytes_per_token"] == 0
    # 2 layers x 2 all-reduces + the embedding's, 128 float32 values per token each
    assert two["all_reduce_bytes_per_token"] == two["expected_all_reduce_bytes_per_token"] == (
        5 * 128 * 4)
    assert two["broadcast_bytes_per_step"] > 0
    assert two["weights_per_worker_mb"] < 0.6 * one["weights_per_worker_mb"]


def test_tensor_parallel_size_that_does_not_divide_is_one_clear_line(tiny_tp_model_dir):
    result = bench("throughput", "--model", str(tiny_tp_model_dir), "-n", "1", "-tp", "3")
    assert result.exit_code == 1
    assert "sizes that work: 1, 2, 4" in result.output


def test_quality_scores_agreement_and_held_out_replies(tiny, tmp_path):
    out = tmp_path / "q.json"
    result = bench("quality", *tiny, "-n", "2", "--max-tokens", "4", "--dtype", "float32",
                   "--replies", "3", "--json", str(out))
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())["engines"]["pagedchat"]
    assert figures["prompts"] == 2 and figures["first_token_agreement"] == 1
    assert figures["replies"] == 3 and figures["reply_tokens"] == 3 * 64
    # exact float32 weights: the same perplexity as transformers'
    assert figures["perplexity"] == pytest.approx(figures["hf_float32_perplexity"], rel=1e-4)
    assert "perplexity=" in result.stdout


def test_warm_start_reads_the_session_back_and_answers_the_same(tiny, tmp_path):
    out = tmp_path / "w.json"
    result = bench("warm-start", *tiny, "--context", "64", "--rounds", "1", "--check-tokens",
                   "4", "--kv-memory", "4MiB", "--kv-store", str(tmp_path / "kv"),
                   "--json", str(out))
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())["engines"]["pagedchat"]
    assert figures["greedy_identical"] is True
    assert figures["warm_cached_tokens"] == 64  # the whole session, from the store
    assert figures["store_bytes"] > 0


def test_regenerate_computes_no_prompt_token(tiny, tmp_path):
    out = tmp_path / "r.json"
    result = bench("regenerate", *tiny, "--context", "60", "--reply-tokens", "24", "--rounds",
                   "1", "--kv-memory", "4MiB", "--json", str(out))
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())["engines"]["pagedchat"]
    assert figures["prompt_tokens"] == 60 and figures["recomputed_tokens"] == 0
    assert figures["regenerate_ttft_s"] > 0 and figures["decode_step_s"] > 0
