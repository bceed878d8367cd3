"""The Triton kernels against the torch reference, on random paged caches.

On a machine without CUDA they run in the Triton interpreter (TRITON_INTERPRET=1, set here
before Triton is imported), which executes each program in numpy: sizes stay tiny.
Cache slots that no sequence owns hold NaN, and outputs are NaN before each run, so a read
outside the context or an element left unwritten fails the comparison.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

if not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton decides interpreter or compiler when it is imported, for its own
        # library functions too; too late to switch now.
        raise RuntimeError(
            "triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot run "
            "on this CPU: set it in the environment or in tests/conftest.py"
        )
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

from paged_cases import DEVICE, TOL, paged_batch, rel_err, windowed  # noqa: E402

from pagedchat.kernels import reference as ref  # noqa: E402
from pagedchat.kernels.kv_int8 import SCALE_BYTES  # noqa: E402

if HAS_TRITON:
    tb = importlib.import_module("pagedchat.kernels.triton_backend")

INTERPRETED = DEVICE.type != "cuda"


def covering(*axes) -> list[tuple]:
    """Every combination of the axes' values on a GPU. In the interpreter, which runs each
    program in numpy, the fewest rows of the product (picked greedily) that still hold
    every pair of values of any two axes."""
    full = list(itertools.product(*axes))
    if not INTERPRETED:
        return full

    def pairs(row: tuple) -> set:
        return {(i, row[i], j, row[j]) for i, j in itertools.combinations(range(len(row)), 2)}

    left, rows = set().union(*map(pairs, full)), []
    while left:
        rows.append(max(full, key=lambda row: len(pairs(row) & left)))
        left -= pairs(rows[-1])
    return rows


def run_and_compare(batch: dict, dtype: torch.dtype, fn, window: int | None = None,
                    **kwargs) -> None:
    """``fn`` against the reference; with ``window``, over the batch as a sliding-window
    group holds it (holes and NaN blocks before each chunk's first window)."""
    scale = batch["query"].shape[-1] ** -0.5
    # The reference runs on CPU copies (it builds its causal mask on the CPU).
    expected = ref.paged_attention(**{k: t.cpu() for k, t in batch.items()}, scale=scale,
                                   window=window)
    if window is not None:
        batch, kwargs = windowed(batch, window), kwargs | {"window": window}
    out = torch.full_like(batch["query"], float("nan"))
    result = fn(**batch, scale=scale, out=out, **kwargs)
    assert result.data_ptr() == out.data_ptr()
    assert rel_err(out.cpu(), expected) < TOL[dtype]


# (block_size, head_dim, num_kv_heads, gqa ratio): 9/3/64 is SmolLM2-135M.
SHAPES = [
    (8, 64, 3, 3),
    (16, 128, 2, 1),
    (32, 64, 1, 8),
    (16, 64, 2, 8),
    (8, 128, 1, 3),
]
DECODE_CTX = [1, 7, 33, 50]  # a length-1 sequence and lengths ending mid-block


@pytest.mark.parametrize(("block_size", "head_dim", "group", "dtype"), covering(
    [8, 16, 32], [64, 128], [1, 3, 8], [torch.float32, torch.bfloat16]), ids=str)
def test_decode_matches_reference(block_size, head_dim, group, dtype):
    kv_heads = 2 if group < 8 else 1
    batch = paged_batch(
        DECODE_CTX,
        [1] * len(DECODE_CTX),
        block_size,
        kv_heads * group,
        kv_heads,
        head_dim,
        dtype,
        seed=block_size + head_dim + group,
    )
    run_and_compare(batch, dtype, tb.paged_attention)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [2, 4, 8])
def test_decode_split_k_matches_reference(num_splits, dtype):
    # tile_n=16: several tiles per split; the length-1 sequence leaves most splits empty.
    ctx = [1, 61, 100]
    batch = paged_batch(ctx, [1, 1, 1], 16, 9, 3, 64, dtype, seed=num_splits)
    run_and_compare(
        batch,
        dtype,
        tb.paged_attention_decode,
        max_context_len=max(ctx),
        num_splits=num_splits,
        tile_n=16,
    )


def test_decode_skips_sequences_without_a_query():
    # Sequence 1 has no query row this step (padding): rows belong to sequences 0 and 2.
    batch = paged_batch([9, 20, 4], [1, 0, 1], 8, 6, 2, 64, torch.float32, seed=3)
    run_and_compare(batch, torch.float32, tb.paged_attention)
    run_and_compare(
        batch,
        torch.float32,
        tb.paged_attention_decode,
        max_context_len=20,
        num_splits=2,
        tile_n=16,
    )


PREFILL_CASES = [
    # (context_lens, query_lens): whole prompts, chunks after a cached prefix, decode rows
    # mixed in, a padding sequence with no rows, a chunk longer than one query tile.
    ([5, 12], [5, 12]),
    ([40, 9, 1, 23], [7, 1, 1, 23]),
    ([30, 17, 6], [30, 0, 2]),
]


@pytest.mark.parametrize(("shape", "case", "dtype"), covering(
    SHAPES, range(len(PREFILL_CASES)), [torch.float32, torch.bfloat16]), ids=str)
def test_prefill_matches_reference(shape, case, dtype):
    block_size, head_dim, kv_heads, group = shape
    ctx, q_lens = PREFILL_CASES[case]
    batch = paged_batch(
        ctx,
        q_lens,
        block_size,
        kv_heads * group,
        kv_heads,
        head_dim,
        dtype,
        seed=case,
    )
    run_and_compare(batch, dtype, tb.paged_attention)


def test_prefill_small_tiles_many_steps():
    # 16x16 tiles: several query tiles per sequence, the causal edge inside a tile.
    ctx, q_lens = [45, 37], [20, 37]
    batch = paged_batch(ctx, q_lens, 8, 8, 8, 64, torch.float32, seed=11)
    run_and_compare(
        batch,
        torch.float32,
        tb.paged_attention_prefill,
        max_query_len=max(q_lens),
        block_m=16,
        block_n=16,
    )


@settings(max_examples=20 if INTERPRETED else 40, deadline=None, derandomize=True)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 40)), min_size=1, max_size=4),
    block_size=st.sampled_from([8, 16, 32]),
    head_dim=st.sampled_from([64, 80, 128]),
    kv_heads=st.integers(1, 3),
    group=st.sampled_from([1, 2, 3, 8]),
    seed=st.integers(0, 2**16),
)
def test_random_batches_match_reference(seqs, block_size, head_dim, kv_heads, group, seed):
    # Any mix of decode rows, chunks and padding; head_dim 80 is not a power of two.
    ctx = [c for c, _ in seqs]
    q_lens = [min(q, c) for c, q in seqs]
    batch = paged_batch(
        ctx, q_lens, block_size, kv_heads * group, kv_heads, head_dim, torch.float32, seed
    )
    run_and_compare(batch, torch.float32, tb.paged_attention)


@pytest.mark.parametrize("window", [1, 6, 19])
def test_sliding_windows_match_reference(window):
    """Decode rows (split over programs too), chunks after a prefix, a chunk longer than
    one query tile: each row reads only its window, never the holes before it."""
    decode = paged_batch([1, 61, 100], [1, 1, 1], 8, 6, 2, 64, torch.float32, seed=window)
    run_and_compare(decode, torch.float32, tb.paged_attention, window=window)
    run_and_compare(decode, torch.float32, tb.paged_attention_decode, window=window,
                    max_context_len=100, num_splits=4, tile_n=16)
    chunks = paged_batch([45, 40, 9, 23], [20, 7, 1, 23], 8, 6, 2, 64, torch.float32,
                         seed=window)
    run_and_compare(chunks, torch.float32, tb.paged_attention_prefill, window=window,
                    max_query_len=23, block_m=16, block_n=16)
    # query tiles taller than key tiles: a row's window can begin a key tile later
    chunks = paged_batch([70, 50], [70, 40], 8, 6, 2, 64, torch.bfloat16, seed=window)
    run_and_compare(chunks, torch.bfloat16, tb.paged_attention_prefill, window=window,
                    max_query_len=70, block_m=64, block_n=16)


def test_hints_give_the_same_result():
    batch = paged_batch([13, 3], [4, 3], 8, 9, 3, 64, torch.float32, seed=5)
    scale = 0.125
    plain = tb.paged_attention(**batch, scale=scale)
    hinted = tb.paged_attention(**batch, scale=scale, max_query_len=4, max_context_len=13)
    torch.testing.assert_close(plain, hinted, rtol=0, atol=0)


def test_choose_num_splits():
    # Enough (sequence, kv head) programs to fill the device: no split.
    assert tb.choose_num_splits(256, 8, 4096, num_cores=132) == 1
    # Short contexts never split below 256 tokens per split.
    assert tb.choose_num_splits(1, 1, 200, num_cores=132) == 1
    assert tb.choose_num_splits(1, 1, 600, num_cores=132) == 2
    # One long sequence: a power of two, capped.
    splits = tb.choose_num_splits(1, 3, 4096, num_cores=132)
    assert splits == 16 and splits & (splits - 1) == 0
    assert tb.choose_num_splits(1, 1, 1 << 20, num_cores=132) == 64


def nan_cache(num_blocks, block_size, kv_heads, head_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    cache[num_blocks // 2 :] = float("nan")  # NaN must be copied as NaN, bit for bit
    return cache


@pytest.mark.parametrize(
    ("block_size", "kv_heads", "head_dim", "dtype", "cache_dtype", "slot_dtype"),
    [
        (8, 3, 64, torch.float32, torch.float32, torch.int64),
        (16, 2, 128, torch.bfloat16, torch.bfloat16, torch.int32),
        (32, 1, 64, torch.float32, torch.bfloat16, torch.int64),
    ],
)
def test_store_kv_matches_reference(block_size, kv_heads, head_dim, dtype, cache_dtype, slot_dtype):
    gen = torch.Generator().manual_seed(block_size)
    num_blocks, n = 6, 21
    k_cache = nan_cache(num_blocks, block_size, kv_heads, head_dim, cache_dtype, 1)
    v_cache = nan_cache(num_blocks, block_size, kv_heads, head_dim, cache_dtype, 2)
    # key/value as strided views of one fused projection, as a model produces them
    fused = torch.randn(n, 3 * kv_heads, head_dim, generator=gen).to(dtype)
    key, value = fused[:, :kv_heads], fused[:, 2 * kv_heads :]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:n]
    slots[[2, 9, 20]] = -1  # padding rows
    slots = slots.to(slot_dtype)
    k_exp, v_exp = k_cache.clone(), v_cache.clone()
    ref.store_kv(key, value, k_exp, v_exp, slots)
    k_out, v_out = k_cache.to(DEVICE), v_cache.to(DEVICE)
    tb.store_kv(key.to(DEVICE), value.to(DEVICE), k_out, v_out, slots.to(DEVICE))
    torch.testing.assert_close(k_out.cpu(), k_exp, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_out.cpu(), v_exp, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(("kv_heads", "head_dim", "dtype"), [
    (3, 64, torch.float32), (2, 128, torch.bfloat16), (1, 80, torch.float32)])
def test_store_kv_into_int8_caches_is_the_reference_byte_for_byte(kv_heads, head_dim, dtype):
    # Rows of several magnitudes (ties of the rounding among them: values that are exact
    # halves of the scale step), a row of zeros (scale 0), padding rows left untouched.
    gen = torch.Generator().manual_seed(head_dim)
    num_blocks, block_size, n = 5, 8, 19
    shape = (num_blocks, block_size, kv_heads, head_dim + SCALE_BYTES)
    k_cache = torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8)
    v_cache = torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8)
    fused = torch.randn(n, 3 * kv_heads, head_dim, generator=gen)
    fused *= torch.logspace(-3, 3, n).view(n, 1, 1)
    fused[4] = 0.0
    fused[7, :, 0] = 127.0
    fused[7, :, 1:] = torch.arange(1, head_dim).float() * 0.5
    fused = fused.to(dtype)
    key, value = fused[:, :kv_heads], fused[:, 2 * kv_heads:]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:n]
    slots[[2, 11]] = -1
    k_exp, v_exp = k_cache.clone(), v_cache.clone()
    ref.store_kv(key, value, k_exp, v_exp, slots)
    k_out, v_out = k_cache.to(DEVICE), v_cache.to(DEVICE)
    tb.store_kv(key.to(DEVICE), value.to(DEVICE), k_out, v_out, slots.to(DEVICE))
    assert torch.equal(k_out.cpu(), k_exp) and torch.equal(v_out.cpu(), v_exp)


@pytest.mark.parametrize(("ctx", "q_lens"), [(DECODE_CTX, [1] * len(DECODE_CTX)),
                                             *PREFILL_CASES], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_over_int8_caches_matches_reference(ctx, q_lens, dtype):
    # Unused slots have a NaN scale: a read outside a context shows up.
    batch = paged_batch(ctx, q_lens, 8, 6, 2, 64, dtype, seed=len(ctx), kv_dtype=torch.int8)
    run_and_compare(batch, dtype, tb.paged_attention)


def test_split_decode_over_int8_caches_matches_reference():
    ctx = [1, 61, 100]
    batch = paged_batch(ctx, [1, 1, 1], 16, 9, 3, 64, torch.float32, seed=4,
                        kv_dtype=torch.int8)
    run_and_compare(batch, torch.float32, tb.paged_attention_decode, max_context_len=max(ctx),
                    num_splits=4, tile_n=16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_blocks_matches_reference(dtype):
    layers, num_blocks = 3, 8
    k_caches = [nan_cache(num_blocks, 16, 3, 64, dtype, 10 + i) for i in range(layers)]
    v_caches = [nan_cache(num_blocks, 16, 3, 64, dtype, 20 + i) for i in range(layers)]
    mapping = torch.tensor([[0, 5], [2, 1], [6, 3], [7, 4]], dtype=torch.int64)
    k_exp = [c.clone() for c in k_caches]
    v_exp = [c.clone() for c in v_caches]
    ref.copy_blocks(k_exp, v_exp, mapping)
    k_out = [c.to(DEVICE) for c in k_caches]
    v_out = [c.to(DEVICE) for c in v_caches]
    tb.copy_blocks(k_out, v_out, mapping)
    for got, exp in zip(k_out + v_out, k_exp + v_exp, strict=True):
        torch.testing.assert_close(got.cpu(), exp, rtol=0, atol=0, equal_nan=True)
    tb.copy_blocks(k_out, v_out, torch.empty((0, 2), dtype=torch.int64))  # no-op


def test_swap_blocks_and_the_sampler_reduction_are_the_reference():
    assert tb.swap_blocks is ref.swap_blocks
    assert tb.max_logsumexp is ref.max_logsumexp
