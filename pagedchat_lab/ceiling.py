"""The machine's matrix-product ceiling at the model's own shapes.

One decode step of a batch is, for its matrix work, one product per weight matrix. Timing
one step's products on random data at the model's shapes, each layer with its own weights
(so that they stream from memory as the model's do), gives the GFLOP/s this CPU reaches and
the tokens/s no engine can beat (attention, sampling and everything else come on top).
Shapes are those of a fused model (q|k|v and gate|up in one matrix each); the FLOPs are the
same as unfused.

Two products are timed and the faster is the ceiling: torch's ``F.linear`` (MKL's sgemm
in float32, what transformers runs) and the CPU kernels' (oneDNN on weights packed into its
own layout where torch has oneDNN, the C product for a decode step's rows).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pagedchat.kernels import cpu

# name -> (lay a weight out once, multiply by it): torch's own, and the CPU kernels'
PRODUCTS = {
    "torch": (lambda weight: weight, F.linear),
    "pagedchat": (cpu.pack_linear, cpu.linear),
}


def matmul_shapes(config: dict) -> list[tuple[int, int, int]]:
    """``(in_features, out_features, count)`` of every weight matrix of a Llama-family model."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    layers = config["num_hidden_layers"]
    inter = config["intermediate_size"]
    return [
        (hidden, (heads + 2 * kv_heads) * head_dim, layers),
        (heads * head_dim, hidden, layers),
        (hidden, 2 * inter, layers),
        (inter, hidden, layers),
        (hidden, config["vocab_size"], 1),
    ]


def flops_per_token(config: dict) -> float:
    return float(sum(2 * i * o * n for i, o, n in matmul_shapes(config)))


def work_flops(config: dict, prompt_tokens: int, output_tokens: int) -> float:
    """The matrix FLOPs a run had to do: every token goes through every layer, and only
    sampled tokens (one per output token) through the head."""
    per_token = flops_per_token(config)
    head = 2.0 * config["hidden_size"] * config["vocab_size"]
    return prompt_tokens * (per_token - head) + output_tokens * per_token


def _seconds_per_step(config: dict, batch: int, dtype: torch.dtype, min_time: float,
                      product: str) -> float:
    """One step's products, each weight matrix a distinct tensor read once, as in the model
    (the order does not matter: no matrix is reused within a step)."""
    pack, multiply = PRODUCTS[product]
    products = []
    for i, o, n in matmul_shapes(config):
        x, first = torch.randn(batch, i).to(dtype), torch.rand(o, i).to(dtype)
        products += [(x, pack(first))] + [(x, pack(first.clone())) for _ in range(n - 1)]

    def step() -> None:
        for x, weight in products:
            multiply(x, weight)

    step()  # warm-up: first calls pay for allocation and dispatch
    reps, start = 0, time.perf_counter()
    while True:
        step()
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time and reps >= 3:
            return elapsed / reps


def measure_ceiling(config: dict, batch: int = 64, dtypes: tuple[str, ...] = ("float32",
                    "bfloat16"), min_time: float = 0.5) -> dict[str, object]:
    """GFLOP/s and tokens/s ceilings for each dtype at ``batch`` tokens per step: the
    fastest of ``PRODUCTS`` (each one's GFLOP/s under ``products``)."""
    flops = flops_per_token(config)
    result: dict[str, object] = {"batch": batch, "gflop_per_token": flops / 1e9}
    for name in dtypes:
        rates = {product: flops * batch / _seconds_per_step(
                     config, batch, getattr(torch, name), min_time, product) / 1e9
                 for product in PRODUCTS}
        fastest = max(rates, key=rates.get)
        result[name] = {"gflop_per_s": rates[fastest], "tokens_per_s": rates[fastest] * 1e9
                        / flops, "product": fastest, "products": rates}
    return result


def load_config(folder: Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())
