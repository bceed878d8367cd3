"""The matmul ceiling and how results are written."""

from __future__ import annotations

import io
import json

from rich.console import Console

from pagedchat import console
from pagedchat_lab import report
from pagedchat_lab.ceiling import flops_per_token, matmul_shapes, measure_ceiling, work_flops

SMOLLM2 = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152}


def test_flops_per_token_of_smollm2():
    # 2 FLOPs per weight of every matrix: 30 layers of q,k,v,o,gate,up,down plus the lm head
    layer = 576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536
    assert flops_per_token(SMOLLM2) == 2 * (30 * layer + 576 * 49152)
    assert matmul_shapes(SMOLLM2)[0] == (576, 576 + 2 * 192, 30)


def test_work_counts_prompt_tokens_without_the_head():
    head = 2 * 576 * 49152
    assert work_flops(SMOLLM2, 0, 10) == 10 * flops_per_token(SMOLLM2)
    assert work_flops(SMOLLM2, 7, 0) == 7 * (flops_per_token(SMOLLM2) - head)


def test_ceiling_is_measured():
    tiny = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 64, "vocab_size": 100}
    found = measure_ceiling(tiny, batch=8, min_time=0.001)
    for dtype in ("float32", "bfloat16"):
        assert found[dtype]["gflop_per_s"] > 0
        assert found[dtype]["tokens_per_s"] > 0
        # the ceiling is the fastest product measured, and names it
        products = found[dtype]["products"]
        assert set(products) == {"torch", "pagedchat"}
        assert found[dtype]["gflop_per_s"] == max(products.values())
        assert products[found[dtype]["product"]] == found[dtype]["gflop_per_s"]


def test_plain_lines_when_piped():
    out = io.StringIO()
    console = Console(file=out, width=200)
    report.emit_table("throughput", [{"engine": "pagedchat", "requests_per_s": 1.5,
                                      "ttft_ms_mean": float("nan")}],
                      ["engine", "requests_per_s", "ttft_ms_mean"], console=console)
    line = out.getvalue().strip()
    assert line == "throughput engine=pagedchat requests_per_s=1.5 ttft_ms_mean=nan"


def test_json_and_plots(tmp_path):
    class Config:
        dtype, weights, block_size, num_kv_blocks = "float32", "gguf", 16, 100

    meta = console.run_metadata(Config(), "model-x")
    report.write_json(tmp_path / "r.json", meta, {"pagedchat": {"requests_per_s": 2.0}})
    data = json.loads((tmp_path / "r.json").read_text())
    assert set(data["metadata"]) == {"model", "dtype", "weights", "block_size",
                                     "num_kv_blocks", "versions", "git_commit", "cpu_count",
                                     "cpu", "cpu_kernels"}
    assert data["metadata"]["cpu"]["name"]
    assert data["metadata"]["cpu_kernels"] in ("portable", "avx2", "avx512", "none")
    assert data["engines"]["pagedchat"]["requests_per_s"] == 2.0
    report.plot_lines(tmp_path / "l.png", {"a": [(1, 0.1), (2, 0.3)]}, "x", "y", "t")
    report.plot_stacked(tmp_path / "s.png", {"a": {"token_states": 0.5, "free": 0.5}},
                        ["token_states", "free"], "t")
    for name in ("l.png", "s.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
