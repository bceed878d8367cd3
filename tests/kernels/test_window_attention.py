"""Sliding-window attention (Gemma 3's local layers): the reference against the window's
definition, and the CPU kernels (row by row, chunked prefill, SDPA; float and int8 caches,
on every instruction-set level) against the reference. The tables' entries wholly before a
chunk's first window are holes and their blocks NaN, as a local group's are: never read."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from paged_cases import TOL, paged_batch, rel_err, windowed

from pagedchat.kernels import cpu
from pagedchat.kernels import reference as ref
from pagedchat.kernels.cpu import attention
from pagedchat.kernels.cpu import build as cpu_build

pytestmark = pytest.mark.skipif(cpu.kernel_library() is None, reason="no C compiler")


@pytest.fixture(autouse=True, scope="module", params=cpu_build.runnable_isas())
def isa(request):
    cpu.set_isa(request.param)
    yield request.param
    cpu.set_isa(None)


def by_definition(batch: dict, scale: float, window: int) -> torch.Tensor:
    """Each query row over the keys of its window, one row and head at a time."""
    query, tables = batch["query"].float(), batch["block_tables"]
    k_cache, v_cache = batch["k_cache"].float(), batch["v_cache"].float()
    block_size, group = k_cache.shape[1], query.shape[1] // k_cache.shape[2]
    starts = batch["query_start_loc"].tolist()
    out = torch.zeros_like(query)
    for i, context in enumerate(batch["context_lens"].tolist()):
        for row in range(starts[i], starts[i + 1]):
            position = context - (starts[i + 1] - row)
            keys = range(max(position - window + 1, 0), position + 1)
            blocks = [int(tables[i, t // block_size]) for t in keys]
            offsets = [t % block_size for t in keys]
            for head in range(query.shape[1]):
                k = k_cache[blocks, offsets, head // group]
                v = v_cache[blocks, offsets, head // group]
                out[row, head] = torch.softmax(k @ query[row, head] * scale, 0) @ v
    return out


# decode rows far past the window, runs of rows (a speculative step), a short chunk, a
# long chunk after a prefix (the tiled kernel), a whole prompt and a sequence with no query
CONTEXTS = [300, 100, 40, 1024, 300, 9, 12]
QUERIES = [1, 5, 7, 61, 300, 9, 0]


@pytest.mark.parametrize("window", [1, 7, 16, 33, 512])
def test_reference_reads_each_query_window(window):
    batch = paged_batch(CONTEXTS[:3] + CONTEXTS[5:], QUERIES[:3] + QUERIES[5:], 16, 6, 2,
                        32, torch.float32, seed=window)
    scale = 32 ** -0.5
    out = ref.paged_attention(**windowed(batch, window), scale=scale, window=window)
    assert rel_err(out, by_definition(batch, scale, window)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("group", "head_dim", "block_size"),
                         [(4, 256, 16), (3, 64, 1), (1, 64, 32), (8, 128, 5)])
@pytest.mark.parametrize("window", [1, 7, 33, 512])
def test_kernels_match_reference(monkeypatch, window, block_size, group, head_dim, dtype):
    """Every query shape through the row-by-row and the tiled kernel, never SDPA."""
    monkeypatch.setattr(attention, "_sdpa", lambda *args: pytest.fail("SDPA was used"))
    batch = paged_batch(CONTEXTS, QUERIES, block_size, 2 * group, 2, head_dim, dtype,
                        seed=window + group)
    scale = head_dim ** -0.5
    expected = ref.paged_attention(**batch, scale=scale, window=window)
    out = cpu.paged_attention(**windowed(batch, window), scale=scale, window=window)
    assert rel_err(out, expected) < TOL[dtype]


@pytest.mark.parametrize("window", [5, 40])
def test_sdpa_and_int8_caches_keep_the_window(window):
    """Heads of 72 (SDPA) and int8 caches (the kv8 kernels), with holes before the window."""
    for head_dim, kv_dtype in ((72, None), (64, torch.int8)):
        batch = paged_batch(CONTEXTS, QUERIES, 16, 6, 2, head_dim, torch.float32,
                            seed=window, kv_dtype=kv_dtype)
        scale = head_dim ** -0.5
        expected = ref.paged_attention(**batch, scale=scale, window=window)
        out = cpu.paged_attention(**windowed(batch, window), scale=scale, window=window)
        assert rel_err(out, expected) < TOL[torch.float32]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 200), st.integers(0, 40)), min_size=1, max_size=4),
    window=st.integers(1, 80),
    block_size=st.sampled_from([1, 4, 16]),
    group=st.sampled_from([1, 4]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_random_windowed_batches_match_reference(seqs, window, block_size, group, dtype):
    ctx = [c for c, _ in seqs]
    q_lens = [min(q, c) for c, q in seqs]
    batch = paged_batch(ctx, q_lens, block_size, 2 * group, 2, 64, dtype, seed=window)
    expected = ref.paged_attention(**batch, scale=0.125, window=window)
    out = cpu.paged_attention(**windowed(batch, window), scale=0.125, window=window)
    assert rel_err(out, expected) < TOL[dtype]
