"""Quantized products (kernels/cpu/quant*.c) against the float32 packed path (oneDNN layout, the C
blocked product), or against themselves with 8-bit activations (``--against int8``,
quant_int8*.c), on a GGUF's weights (the default model's unless ``--model``), at several
row counts: each timed run multiplies by the weight of that shape in every layer in turn
(as a step does, so the weights come from memory, not from a cache that holds one of
them), the head on its own. Prints milliseconds per product (best run over layers), the
ratio, and with ``--against int8`` the sum over all shapes.

    python benchmarks/quant_product.py [--rows 1 16 64 256] [--repeats 5] [--threads N]
                                       [--model PATH|NAME] [--against f32|int8]
"""

from __future__ import annotations

import argparse
import functools
import time

import gguf
import numpy as np
import torch

from pagedchat.engine.loading.loader import NAMED_MODELS, default_model_path, named_model_path
from pagedchat.kernels import cpu, quant
from pagedchat.kernels.cpu import quant as cpu_quant
from pagedchat.kernels.quant import QuantizedWeight

SHAPES = {"qkv": ["attn_q", "attn_k", "attn_v"], "o": ["attn_output"],
          "gate_up": ["ffn_gate", "ffn_up"], "down": ["ffn_down"]}


def weights(model: str | None = None) -> dict[str, list[QuantizedWeight]]:
    reader = gguf.GGUFReader(model_path(model))
    tensors = {t.name: t for t in reader.tensors}

    def load(name: str) -> QuantizedWeight:
        t = tensors[name]
        return QuantizedWeight.from_blocks(t.tensor_type.name,
                                           torch.from_numpy(np.array(t.data)), int(t.shape[0]))

    layers = sum(1 for name in tensors if name.endswith(".attn_norm.weight"))
    found = {key: [QuantizedWeight.stack([load(f"blk.{i}.{n}.weight") for n in names])
                   for i in range(layers)] for key, names in SHAPES.items()}
    found["head"] = [load("token_embd.weight")]
    return found


def model_path(model: str | None):
    if model is None:
        return default_model_path()
    return named_model_path(model) if model in NAMED_MODELS else model


def run_all(product, x: torch.Tensor, weights: list) -> None:
    for weight in weights:
        product(x, weight)


def best(run, repeats: int, clock) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = clock()
        run()
        times.append(clock() - start)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--model", help="a GGUF path or a model name (default: SmolLM2)")
    parser.add_argument("--against", choices=["f32", "int8"], default="f32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # one thread: the CPU time this thread used, which time given to other processes on a
    # shared machine does not inflate; more: wall time
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"threads {torch.get_num_threads()}")
    print(f"{'weight':8} {'rows':>5} {'quant ms':>9} {args.against + ' ms':>8} "
          f"{'quant/' + args.against if args.against == 'int8' else 'f32/quant':>10}")
    totals: dict[int, list[float]] = {rows: [0.0, 0.0] for rows in args.rows}
    for key, layers in weights(args.model).items():
        if args.against == "int8":
            others = [QuantizedWeight(w.segments, w.in_features, int8_activations=True)
                      for w in layers]
            other_product = cpu_quant.quantized_linear
        else:
            others = [cpu.pack_linear(quant.dequantize(weight)) for weight in layers]
            other_product = cpu.linear
        for rows in args.rows:
            x = torch.randn(rows, layers[0].in_features)
            q_ms = best(functools.partial(run_all, cpu_quant.quantized_linear, x, layers),
                        args.repeats, clock) / len(layers)
            o_ms = best(functools.partial(run_all, other_product, x, others),
                        args.repeats, clock) / len(layers)
            totals[rows][0] += q_ms * len(layers)
            totals[rows][1] += o_ms * len(layers)
            ratio = q_ms / o_ms if args.against == "int8" else o_ms / q_ms
            print(f"{key:8} {rows:5} {q_ms:9.3f} {o_ms:8.3f} {ratio:10.2f}")
    if args.against == "int8":
        for rows, (q_ms, o_ms) in totals.items():
            print(f"{'all':8} {rows:5} {q_ms:9.3f} {o_ms:8.3f} {q_ms / o_ms:10.2f}")


if __name__ == "__main__":
    main()
