"""Decode PagedAttention micro-benchmark: achieved bandwidth against the device's copy bandwidth.

Decode attention is memory bound: each step must read the K and V of every context token
once. This script times the Triton decode kernel (split-K and reduce included) for
batch 1..256 and context 128..4096, divides those bytes by the time, and reports the result
as a fraction of what a plain device-to-device copy achieves on the same GPU.

    python benchmarks/kernels.py                    # SmolLM2-135M shape, bfloat16
    python benchmarks/kernels.py --num-heads 32 --num-kv-heads 8 --head-dim 128
    python benchmarks/kernels.py --kv-cache-dtype int8   # int8 K/V rows (kv_int8.py)

Times are medians from ``triton.testing.do_bench``, which flushes the L2 cache before each
run. They include the host-side launch cost of ``paged_attention``, which dominates the
smallest configurations. Needs CUDA; elsewhere it says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-heads", type=int, default=9)
    p.add_argument("--num-kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    p.add_argument("--contexts", default="128,256,512,1024,2048,4096")
    p.add_argument("--kv-cache-dtype", choices=["auto", "int8"], default="auto",
                   help="auto: K/V in --dtype; int8: int8 rows with a float16 scale each")
    return p.parse_args(argv)


def random_cache(shape: tuple, dtype: torch.dtype, int8: bool,
                 gen: torch.Generator | None = None) -> torch.Tensor:
    """Random K or V in ``dtype``, or as int8 rows (``kv_int8.quantize``)."""
    from pagedchat.kernels.kv_int8 import quantize

    values = torch.randn(shape, generator=gen, device="cuda")
    return quantize(values) if int8 else values.to(dtype)


def copy_bandwidth(num_bytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy (bytes read plus bytes written)."""
    import triton.testing

    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * num_bytes / (ms * 1e-3)


def check_once(tb, ref, args: argparse.Namespace, dtype: torch.dtype) -> None:
    """One small batch against the reference before timing anything, with split-K."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    bs, kv, dim = args.block_size, args.num_kv_heads, args.head_dim
    ctx = [1, 300, 1000, 777]
    blocks = [-(-c // bs) for c in ctx]
    int8 = args.kv_cache_dtype == "int8"
    pool = random_cache((sum(blocks), bs, kv, dim), dtype, int8, gen)
    v_pool = random_cache((sum(blocks), bs, kv, dim), dtype, int8, gen)
    perm = torch.randperm(sum(blocks), generator=gen, device="cuda").to(torch.int32)
    tables = torch.full((len(ctx), max(blocks)), -1, dtype=torch.int32, device="cuda")
    used = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = perm[used : used + n]
        used += n
    query = torch.randn(len(ctx), args.num_heads, dim, generator=gen, device="cuda").to(dtype)
    lens = torch.tensor(ctx, dtype=torch.int32, device="cuda")
    starts = torch.arange(len(ctx) + 1, dtype=torch.int32, device="cuda")
    scale = dim**-0.5
    expected = ref.paged_attention(query, pool, v_pool, tables, lens, starts, scale).float()
    for splits in (1, 4):
        out = tb.paged_attention_decode(
            query,
            pool,
            v_pool,
            tables,
            lens,
            starts,
            scale,
            max_context_len=max(ctx),
            num_splits=splits,
        ).float()
        err = float((out - expected).abs().max() / expected.abs().max())
        if not err < (1e-5 if dtype == torch.float32 else 1e-2):
            raise SystemExit(f"decode kernel disagrees with the reference: rel err {err:.2e}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py measures GPU bandwidth and needs CUDA; none found.")
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
    import triton.testing

    from pagedchat.kernels import reference as ref
    from pagedchat.kernels import triton_backend as tb

    dtype = DTYPES[args.dtype]
    batches = [int(x) for x in args.batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    bs, kv, dim, heads = args.block_size, args.num_kv_heads, args.head_dim, args.num_heads
    check_once(tb, ref, args, dtype)

    peak = copy_bandwidth()
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, {props.multi_processor_count} SMs; copy bandwidth {peak / 1e9:.0f} GB/s")
    print(f"heads {heads}, kv heads {kv}, head dim {dim}, block size {bs}, {args.dtype}, "
          f"K/V {args.kv_cache_dtype}")
    print(f"{'batch':>6} {'context':>8} {'splits':>6} {'time us':>9} {'GB/s':>7} {'of copy':>8}")

    # One pool big enough for the largest case; each case uses shuffled blocks of it.
    max_blocks = max(batches) * -(-max(contexts) // bs)
    k_cache = random_cache((max_blocks, bs, kv, dim), dtype, args.kv_cache_dtype == "int8")
    v_cache = random_cache((max_blocks, bs, kv, dim), dtype, args.kv_cache_dtype == "int8")
    row_bytes = k_cache.shape[-1] * k_cache.element_size()  # a head's values (and scale)
    scale = dim**-0.5
    for context in contexts:
        per_seq = -(-context // bs)
        for batch in batches:
            tables = torch.randperm(max_blocks, device="cuda")[: batch * per_seq]
            tables = tables.to(torch.int32).view(batch, per_seq)
            lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
            starts = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
            query = torch.randn(batch, heads, dim, device="cuda").to(dtype)
            out = torch.empty_like(query)

            def run(tables=tables, lens=lens, starts=starts, query=query, out=out, ctx=context):
                tb.paged_attention(
                    query,
                    k_cache,
                    v_cache,
                    tables,
                    lens,
                    starts,
                    scale,
                    max_query_len=1,
                    max_context_len=ctx,
                    out=out,
                )

            ms = triton.testing.do_bench(run, return_mode="median")
            num_bytes = 2 * batch * context * kv * row_bytes  # K and V, each token once
            bw = num_bytes / (ms * 1e-3)
            splits = tb.choose_num_splits(batch, kv, context, props.multi_processor_count)
            print(
                f"{batch:>6} {context:>8} {splits:>6} {ms * 1e3:>9.1f} {bw / 1e9:>7.0f} "
                f"{bw / peak:>8.1%}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
