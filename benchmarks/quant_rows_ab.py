"""Few-row quantized products (decode steps) of two builds in one process: saved products
libraries (BASELINE: copies of the cached ``products-FORMAT[-int8]-*.so`` from before a change,
comma-separated, matched to a weight's format by that name) against the current sources'
products, alternated, each handed to the level's library in turn, over every layer's weight of
that name in the named layer's format (``blk.1.ffn_down.weight``: the layers whose ffn_down is
in layer 1's format) or a single tensor (``output.weight``), at each of ROWS rows of x (default
1). One thread: thread CPU time, best of 5 runs (what the kernel costs); with ``--threads N``:
wall time, median of 9 (weights read from memory as a decode step reads them, where they exceed
the cache). ``--int8``: the products on 8-bit activations. Prints ms, GB/s of weight bytes,
new/old and the largest output difference.

    python benchmarks/quant_rows_ab.py MODEL.gguf products-Q4_K-OLD.so,products-Q6_K-OLD.so \
        blk.0.ffn_gate.weight,output.weight [1,4] [--threads 2] [--int8]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path

import gguf
import numpy as np
import torch

from pagedchat.kernels.cpu import build
from pagedchat.kernels.cpu import quant as cpu_quant
from pagedchat.kernels.quant import QuantizedWeight

ROUNDS = 5


def weights_named(tensors: dict, name: str) -> list[QuantizedWeight]:
    """``name``'s weight, or for a layer's (``blk.N....``) every layer's of that name in
    layer N's format."""
    def load(tensor_name: str) -> QuantizedWeight:
        tensor = tensors[tensor_name]
        return QuantizedWeight.from_blocks(tensor.tensor_type.name,
                                           torch.from_numpy(np.array(tensor.data)),
                                           int(tensor.shape[0]))

    named = load(name)
    if not name.startswith("blk."):
        return [named]
    layers = sum(1 for tensor_name in tensors if tensor_name.endswith(".attn_norm.weight"))
    suffix = name.split(".", 2)[2]
    found = [load(f"blk.{layer}.{suffix}") for layer in range(layers)]
    return [w for w in found if w.segments[0].format == named.segments[0].format]


def with_products(products: dict[int, ctypes.CDLL], x: torch.Tensor,
                  weights: list[QuantizedWeight]) -> list[torch.Tensor]:
    """The products of ``weights`` after handing the level's library ``products`` (by type)."""
    library = build.kernel_library()
    for kind, found in products.items():
        functions = ((found.quant8_rows_part, found.quant8_tile_part)
                     if kind & build.INT8_ACTIVATIONS else (found.quant_rows_part, None))
        library.set_products(kind, *functions)
    return [cpu_quant.quantized_linear(x, w) for w in weights]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a GGUF file")
    parser.add_argument("baseline", help="saved products libraries, comma-separated")
    parser.add_argument("names", help="tensor names, comma-separated")
    parser.add_argument("rows", nargs="?", default="1", help="rows of x, comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="threads of the products")
    parser.add_argument("--int8", action="store_true", help="8-bit activations")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock, rounds, pick = ((time.thread_time, ROUNDS, min) if args.threads == 1
                           else (time.perf_counter, 9, statistics.median))
    tensors = {t.name: t for t in gguf.GGUFReader(args.model).tensors}
    flags = build.kernel_library().build_flags
    saved = {Path(path).name.split("-")[1] + "-int8" * ("-int8-" in path): ctypes.CDLL(path)
             for path in args.baseline.split(",")}
    for name in args.names.split(","):
        weights = [QuantizedWeight(w.segments, w.in_features, int8_activations=args.int8)
                   for w in weights_named(tensors, name)]
        kind = weights[0].segments[0].kernel_type(args.int8)
        saved_as = weights[0].segments[0].format.name + "-int8" * args.int8
        old, new = {kind: saved[saved_as]}, {kind: build.products_library(flags, kind)}
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, weights[0].in_features)
            difference = (torch.cat(with_products(old, x, weights), 1)
                          - torch.cat(with_products(new, x, weights), 1)).abs().max().item()
            spent: dict[str, list[float]] = {"old": [], "new": []}
            for _ in range(rounds):
                for label, products in (("old", old), ("new", new)):
                    start = clock()
                    with_products(products, x, weights)
                    spent[label].append((clock() - start) * 1e3 / len(weights))
            before, after = pick(spent["old"]), pick(spent["new"])
            megabytes = weights[0].nbytes / 1e6
            print(f"{name:24} {rows}r {weights[0].segments[0].format.name} x{len(weights):<2} "
                  f"{megabytes:7.2f}MB old {before:7.3f} ms ({megabytes / before:5.2f} GB/s) "
                  f"new {after:7.3f} ms ({megabytes / after:5.2f} GB/s) "
                  f"new/old {after / before:.2f} maxdiff {difference:.2e}")


if __name__ == "__main__":
    main()
