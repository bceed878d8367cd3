"""The compiled CPU kernels (and the SDPA path) against the torch reference, on every
instruction-set level this CPU runs (portable, AVX2, AVX-512), each level's library loaded
in turn."""

from __future__ import annotations

import functools

import pytest
import torch
from guarded import EDGES, at_page_edge
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from paged_cases import TOL, guarded_blocks, paged_batch, rel_err

from pagedchat.kernels import cpu
from pagedchat.kernels import reference as ref
from pagedchat.kernels.cpu import attention, build
from pagedchat.kernels.cpu.linear import (
    BLOCKED_ROWS,
    LINEAR_ROWS,
    _onednn,
    _onednn_bfloat16,
    blocked_width,
    onednn_rows,
)

pytestmark = pytest.mark.skipif(cpu.kernel_library() is None, reason="no C compiler")


@pytest.fixture(autouse=True, scope="module", params=build.runnable_isas())
def isa(request):
    """Every test of this module, once per level: the dispatch calls that level's library."""
    cpu.set_isa(request.param)
    assert cpu.isa() == request.param
    yield request.param
    cpu.set_isa(None)


# The fixed attention grids take the level innermost (each case on every level in turn),
# so that a case's batch and reference, which cost far more than the kernel, are made once.
on_each_level = pytest.mark.parametrize("isa", build.runnable_isas(), indirect=True,
                                        scope="function")


def compare(batch: dict, dtype: torch.dtype, expected: torch.Tensor | None = None) -> None:
    scale = batch["query"].shape[-1] ** -0.5
    if expected is None:
        expected = ref.paged_attention(**batch, scale=scale)
    out = cpu.paged_attention(**batch, scale=scale)
    assert rel_err(out, expected) < TOL[dtype]


@functools.lru_cache(maxsize=1)
def _reference_case(context_lens: tuple, query_lens: tuple, *shape) -> tuple[dict, torch.Tensor]:
    batch = paged_batch(list(context_lens), list(query_lens), *shape)
    return batch, ref.paged_attention(**batch, scale=batch["query"].shape[-1] ** -0.5)


def compare_case(context_lens: list[int], query_lens: list[int], block_size: int,
                 num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 seed: int) -> None:
    """``compare(paged_batch(...))``, the batch and its reference kept for the next level."""
    batch, expected = _reference_case(tuple(context_lens), tuple(query_lens), block_size,
                                      num_heads, num_kv_heads, head_dim, dtype, seed)
    compare(batch, dtype, expected)


@on_each_level
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_decode_matches_reference(block_size, head_dim, group, dtype):
    kv_heads = 2 if group < 8 else 1
    ctx = [1, 7, 33, 300]
    compare_case(ctx, [1] * 4, block_size, kv_heads * group, kv_heads, head_dim, dtype,
                 seed=block_size + head_dim + group)


@on_each_level
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("kv_heads", "group", "head_dim"),
                         [(1, 4, 256), (1, 3, 64), (1, 8, 128), (2, 3, 80), (1, 1, 64)])
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_lone_decode_with_fewer_kv_heads_than_threads(threads, kv_heads, group, head_dim,
                                                      dtype):
    """One or two sequences decoding over a long context with fewer KV heads than threads
    (Gemma 3 270M's one): each KV head's query heads are split into slices, evenly or not,
    one work item each, and every output head is still its reference's."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for ctx in ([700], [300, 45]):
            compare_case(ctx, [1] * len(ctx), 16, kv_heads * group, kv_heads, head_dim, dtype,
                         seed=threads + group + head_dim)
    finally:
        torch.set_num_threads(previous)


@on_each_level
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_batch_of_decodes_short_and_long_chunks(dtype):
    # decode rows, a short chunk after a cached prefix (kernel), a long chunk after a
    # cached prefix and a whole prompt (both SDPA), and a sequence with no query
    ctx = [40, 50, 90, 64, 12]
    q_lens = [1, 10, 60, 64, 0]
    compare_case(ctx, q_lens, 16, 9, 3, 64, dtype, seed=4)


@on_each_level
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("group", "head_dim", "block_size"),
                         [(3, 64, 16), (1, 64, 1), (8, 128, 5), (2, 80, 16)])
def test_runs_of_rows_of_one_sequence_match_reference(block_size, group, head_dim, dtype):
    """A speculative step's shape: sequences with 2 to 7 query rows (one work item each,
    their earlier rows seeing fewer tokens than their last) beside decode rows, a run
    ending at a tile's edge (ctx 32) and one as long as its whole context."""
    ctx = [100, 1, 32, 17, 5, 300, 7]
    q_lens = [5, 1, 7, 2, 5, 1, 7]
    compare_case(ctx, q_lens, block_size, 2 * group, 2, head_dim, dtype, seed=group + head_dim)


@on_each_level
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("group", "head_dim"),
                         [(1, 64), (3, 64), (8, 128), (4, 64), (4, 256), (1, 192), (7, 64),
                          (6, 128)])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_prompt_chunks_match_reference_without_sdpa(monkeypatch, block_size, group, head_dim,
                                                    dtype):
    """Long chunks go to the chunked-prefill kernel (never to SDPA) when it is built: a
    whole prompt, chunks after a cached prefix, one of 1,024 keys (the stride that once
    aliased in L1), item tiles cut short (q_len not a multiple of the positions per item,
    e.g. 24 / 4 = 6 for group 4; groups of 7 and 6, Qwen2.5 0.5B's and 1.5B's, computed
    with rows for nothing), next to decode rows. Heads of 256 (Gemma 3's) and 192 take more
    output vectors than a build keeps in registers at once."""
    monkeypatch.setattr(attention, "_sdpa", lambda *args: pytest.fail("SDPA was used"))
    ctx = [300, 1024, 50, 77, 9]
    q_lens = [300, 61, 8, 1, 9]
    compare_case(ctx, q_lens, block_size, 2 * group, 2, head_dim, dtype,
                 seed=block_size + group)


def test_prompt_chunks_take_sdpa_where_the_kernel_does_not_apply(monkeypatch):
    """Head sizes that are not a multiple of 16 go to SDPA."""
    calls = []
    sdpa = attention._sdpa
    monkeypatch.setattr(attention, "_sdpa", lambda *args: calls.append(1) or sdpa(*args))
    for dtype in (torch.float32, torch.bfloat16):
        calls.clear()
        head_dim = 72
        compare(paged_batch([60, 40], [60, 30], 16, 6, 2, head_dim, dtype, seed=3), dtype)
        assert len(calls) == 2


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 120), st.integers(0, 40)), min_size=1, max_size=5),
    block_size=st.sampled_from([1, 2, 8, 16, 32]),
    group=st.sampled_from([1, 3, 8]),
    head_dim=st.sampled_from([64, 80]),  # 80: the generic path, not a multiple of 16
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 1000),
)
def test_random_batches_match_reference(seqs, block_size, group, head_dim, dtype, seed):
    ctx = [c for c, _ in seqs]
    q_lens = [min(q, c) for c, q in seqs]
    compare(paged_batch(ctx, q_lens, block_size, 2 * group, 2, head_dim, dtype, seed), dtype)


@pytest.mark.parametrize("edge", EDGES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("block_size", "head_dim"), [(16, 64), (5, 80), (1, 64)])
def test_attention_reads_only_the_blocks_it_is_given(edge, dtype, block_size, head_dim):
    """A pool of just the blocks the tables name, its first and last blocks filled to their
    last slot, lying against an unreadable page, as do the queries and tables: a decode, a
    short chunk and a long one (the tiled kernel) read nothing outside them."""
    contexts = [3 * block_size, 12 + block_size, 2 * block_size + 3]
    batch = paged_batch(contexts, [1, 12, 3], block_size, 4, 2, head_dim, dtype, seed=5)
    guarded = guarded_blocks(batch, contexts, block_size, edge)
    expected = ref.paged_attention(**batch, scale=head_dim ** -0.5)
    compare(guarded, dtype, expected)


@pytest.mark.parametrize("edge", EDGES)
def test_head_and_layer_kernels_read_only_their_operands(edge):
    """Every operand against an unreadable page, widths with vector tails: the greedy
    head's screen and reduction, the float32 product, the norm, the gated activation and
    the rotary embedding with its stores into the pool's first and last slots."""
    gen = torch.Generator().manual_seed(8)
    approx = torch.randn(3, 300, generator=gen) * 4
    norms, slacks = torch.rand(300, generator=gen), torch.rand(3, generator=gen)
    found = cpu.screen_candidates(at_page_edge(approx, edge), at_page_edge(norms, edge),
                                  at_page_edge(slacks, edge), 40)
    for mine, expected in zip(found, ref.screen_candidates(approx, norms, slacks, 40),
                              strict=True):
        assert torch.equal(mine, expected)
    for dtype in (torch.float32, torch.bfloat16):
        _compare_reductions(at_page_edge(approx.to(dtype), edge))
    x, weight = torch.randn(5, 100, generator=gen), torch.randn(7, 100, generator=gen)
    bias = torch.randn(7, generator=gen)
    out = torch.empty(5, 7)
    operands = [at_page_edge(t, edge) for t in (x, weight, bias)]  # alive through the call
    cpu.kernel_library().linear_f32(*(t.data_ptr() for t in operands), out.data_ptr(),
                                    5, 100, 7, 2)
    assert torch.allclose(out, ref.linear(x, weight, bias), rtol=1e-5, atol=1e-4)
    for dtype in (torch.float32, torch.bfloat16):
        rows = torch.randn(7, 100, generator=gen).to(dtype)
        scale = torch.randn(100, generator=gen).to(dtype)
        out, total = cpu.rms_norm(at_page_edge(rows, edge), at_page_edge(scale, edge), 1e-6,
                                  at_page_edge(rows.flip(0), edge))
        ref_out, ref_total = ref.rms_norm(rows, scale, 1e-6, rows.flip(0))
        assert _close(out, ref_out) and torch.equal(total, ref_total)
        gate_up = torch.randn(5, 200, generator=gen).to(dtype)
        assert _close(cpu.silu_mul(at_page_edge(gate_up, edge)), ref.silu_mul(gate_up))
        assert _close(cpu.gelu_tanh_mul(at_page_edge(gate_up, edge)),
                      ref.gelu_tanh_mul(gate_up))
        qkv = torch.randn(3, (4 + 2 * 2) * 80, generator=gen).to(dtype)  # 4 heads, 2 of KV
        cos, sin = (torch.rand(3, 80, generator=gen).to(dtype) for _ in range(2))
        slots = torch.tensor([5, 0, 3])  # the pool's last and first slots
        caches = [torch.zeros(6, 1, 2, 80, dtype=dtype) for _ in range(2)]
        guarded_caches = [at_page_edge(c, edge) for c in caches]
        q = cpu.rotary_store(*(at_page_edge(t, edge) for t in (qkv, cos, sin)), 4,
                             *guarded_caches, at_page_edge(slots, edge))
        assert _close(q, ref.rotary_store(qkv, cos, sin, 4, *caches, slots))
        assert all(_close(g, c) for g, c in zip(guarded_caches, caches, strict=True))


def test_step_plan_is_reused_across_layers_and_never_across_steps():
    """Layers of one step share the metadata tensors, and the plan made for them; the
    next step's tensors (possibly at the same addresses) get a plan of their own."""
    for seed, (ctx, q_lens) in enumerate([([40, 90], [1, 60]), ([7, 300, 33], [7, 1, 30]),
                                          ([40, 90], [1, 60]), ([5, 300, 33], [1, 1, 1])]):
        batch = paged_batch(ctx, q_lens, 16, 9, 3, 64, torch.float32, seed=seed)
        scale = batch["query"].shape[-1] ** -0.5
        expected = ref.paged_attention(**batch, scale=scale)
        for _layer in range(3):  # the same tensors, as every layer of a step passes them
            assert rel_err(cpu.paged_attention(**batch, scale=scale), expected) < TOL[torch.float32]
        meta = (batch["block_tables"], batch["context_lens"], batch["query_start_loc"])
        assert attention._plan(*meta) is attention._plan(*meta)
        assert attention._plan(*(t.clone() for t in meta)) is not attention._plan(*meta)
        del batch, meta


def test_step_plan_is_made_once_per_layer_group():
    """Gemma 3's layers alternate between two groups' metadata (local, global): each
    group's plan is made by its first layer and reused by the others, in any order."""
    made = []  # the argument sets the plan was made for, in order

    def same(a: tuple, b: tuple) -> bool:
        return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))

    plan = attention._per_step(lambda *tensors: made.append(tensors) or len(made))
    groups = [tuple(torch.arange(n + i) for i in range(3)) for n in (1, 5)]
    order = [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1]
    assert [plan(*groups[g]) for g in order] == [1 + g for g in order]
    assert len(made) == 2 and same(made[0], groups[0]) and same(made[1], groups[1])
    many = [tuple(torch.arange(n + i) for i in range(3)) for n in range(attention.STEP_ENTRIES + 1)]
    for tensors in many:
        plan(*tensors)
    plan(*many[0])  # pushed out by the sets after it: made again
    assert same(made[-1], many[0]) and len(made) == 2 + len(many) + 1


def test_store_kv_matches_reference_and_skips_padding_rows():
    for slots in ([5, 0, 17, 3], [5, -1, 17, -1]):
        key, value = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
        mapping = torch.tensor(slots)
        caches = [torch.zeros(3, 8, 2, 8) for _ in range(4)]
        ref.store_kv(key, value, caches[0], caches[1], mapping)
        for _layer in range(2):
            cpu.store_kv(key, value, caches[2], caches[3], mapping)
        assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def _compare_reductions(logits: torch.Tensor) -> None:
    top, index, lse = cpu.max_logsumexp(logits)
    ref_top, ref_index, ref_lse = ref.max_logsumexp(logits)
    assert top.dtype == lse.dtype == torch.float32
    assert torch.equal(index, ref_index)  # the greedy token: exactly argmax's
    assert torch.equal(top, ref_top)
    assert torch.allclose(lse, ref_lse, rtol=1e-6, atol=1e-5)
    if logits.dtype == torch.bfloat16:  # read as they are: the bits of widening them first
        for mine, widened in zip(cpu.max_logsumexp(logits), cpu.max_logsumexp(logits.float()),
                                 strict=True):
            assert torch.equal(mine, widened)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 9), vocab=st.integers(1, 300), spread=st.floats(0.1, 100.0),
       seed=st.integers(0, 2**16), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_max_logsumexp_matches_reference(rows, vocab, spread, seed, dtype):
    """Any row count and length (vector tails included); bfloat16 logits, with their many
    equal values, test the first-of-equal-maxima rule often."""
    gen = torch.Generator().manual_seed(seed)
    _compare_reductions((torch.randn(rows, vocab, generator=gen) * spread).to(dtype))


def test_max_logsumexp_takes_the_first_of_equal_maxima_and_strided_rows():
    logits = torch.randn(6, 49152, generator=torch.Generator().manual_seed(1))
    logits[0, [7, 4000, 49151]] = 50.0  # in different vector lanes
    logits[1, [33, 17]] = 50.0  # same lane: 17 comes first
    logits[2, 49151] = 60.0  # in the tail
    logits[3] = 0.25  # a flat row: index 0
    _compare_reductions(logits)
    assert cpu.max_logsumexp(logits)[1][:4].tolist() == [7, 17, 49151, 0]
    _compare_reductions(logits[:, :1000])  # rows 49,152 floats apart
    _compare_reductions(logits.bfloat16())
    assert cpu.max_logsumexp(logits.bfloat16())[1][:4].tolist() == [7, 17, 49151, 0]
    _compare_reductions(logits.bfloat16()[:, :1000])


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 7), vocab=st.integers(1, 300), slack=st.floats(0.0, 3.0),
       capacity=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_screen_candidates_matches_reference(rows, vocab, slack, capacity, seed):
    """The greedy head's screen: the same candidates as the reference in the same order,
    the first ``capacity`` of them, and the same counts (an overflow included); every
    row's largest value is always one (it reaches its own lower end)."""
    gen = torch.Generator().manual_seed(seed)
    approx = torch.randn(rows, vocab, generator=gen) * 4
    approx[:, vocab // 2] = approx[:, 0]  # equal values
    norms = torch.rand(vocab, generator=gen) * 2
    slacks = torch.rand(rows, generator=gen) * slack
    found, counts = cpu.screen_candidates(approx, norms, slacks, capacity)
    ref_found, ref_counts = ref.screen_candidates(approx, norms, slacks, capacity)
    assert torch.equal(counts, ref_counts)
    assert torch.equal(found, ref_found)
    best = approx.argmax(dim=1)
    for r in range(rows):
        kept = found[r][found[r] >= 0].tolist()
        assert kept == sorted(kept) and len(kept) == min(int(counts[r]), capacity)
        if counts[r] <= capacity:
            assert int(best[r]) in kept
    # without slack only the row's maxima (2^-20 of its magnitude apart) are left
    found, counts = cpu.screen_candidates(approx, norms, torch.zeros(rows), vocab)
    for r in range(rows):
        kept = found[r][:counts[r]]
        assert (approx[r, kept] >= approx[r].max() - 2.0 ** -20 * approx[r].abs().max()).all()
    # a row of equal values with no slack (a head of zero rows): every id touches the bar
    flat = cpu.screen_candidates(torch.zeros(rows, vocab), torch.zeros(vocab),
                                 torch.zeros(rows), vocab)
    assert flat[1].tolist() == [vocab] * rows and flat[0][:, 0].tolist() == [0] * rows


def test_screen_candidates_on_a_wide_vocabulary_and_strided_rows():
    gen = torch.Generator().manual_seed(2)
    wide = torch.randn(5, 262_147, generator=gen) * 3
    norms = torch.rand(262_147, generator=gen)
    slacks = torch.tensor([0.0, 0.01, 0.1, 0.5, 2.0])
    for approx in (wide, wide[:, :70_000]):
        found, counts = cpu.screen_candidates(approx, norms[:approx.shape[1]], slacks, 512)
        expected = ref.screen_candidates(approx, norms[:approx.shape[1]], slacks, 512)
        assert torch.equal(counts, expected[1]) and torch.equal(found, expected[0])
        assert counts.tolist() == sorted(counts.tolist())  # wider bounds keep more
        assert (found[:, 0] >= 0).all()


def _close(out: torch.Tensor, expected: torch.Tensor) -> bool:
    """Float32 kernels summing in another order than torch: a few ulps apart. bfloat16
    ones compute in float32 and round once where torch rounds after each operation: an ulp
    or two (2^-8 each) apart."""
    if out.dtype == torch.bfloat16:
        return torch.allclose(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
    return torch.allclose(out, expected, rtol=1e-5, atol=1e-6)


DTYPES = st.sampled_from([torch.float32, torch.bfloat16])


@settings(max_examples=40, deadline=None)
@given(rows=st.sampled_from([1, 2, 7, 64, 300]), dim=st.sampled_from([8, 64, 100, 576, 2048]),
       scale=st.floats(1e-3, 50.0), with_residual=st.booleans(), dtype=DTYPES,
       seed=st.integers(0, 2**16))
def test_rms_norm_matches_reference(rows, dim, scale, with_residual, dtype, seed):
    """Any width (vector tails), one row to enough rows for threads, with and without the
    residual add, float32 and bfloat16."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, dim, generator=gen) * scale).to(dtype)
    weight = torch.randn(dim, generator=gen).to(dtype)
    residual = (torch.randn(rows, dim, generator=gen) * scale).to(dtype) if with_residual \
        else None
    out, total = cpu.rms_norm(x, weight, 1e-6, residual)
    ref_out, ref_total = ref.rms_norm(x, weight, 1e-6, residual)
    assert out.dtype == dtype and _close(out, ref_out)
    assert torch.equal(total, ref_total)  # an addition, rounded once either way: exact


@settings(max_examples=30, deadline=None)
@given(tokens=st.sampled_from([1, 3, 40, 700]), kv_heads=st.integers(1, 4),
       group=st.sampled_from([1, 3]), head_dim=st.sampled_from([16, 64, 80, 128, 256]),
       skipped=st.booleans(), dtype=DTYPES, seed=st.integers(0, 2**16))
def test_rotary_store_matches_reference(tokens, kv_heads, group, head_dim, skipped, dtype,
                                        seed):
    """Queries returned, keys and values in their slots (a -1 slot left alone), from fused
    QKV rows of any width; enough tokens for threads; float32 and bfloat16."""
    gen = torch.Generator().manual_seed(seed)
    heads = kv_heads * group
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    angles = torch.rand(tokens, head_dim // 2, generator=gen) * 100
    cos, sin = (torch.cat([f(angles)] * 2, dim=1).to(dtype) for f in (torch.cos, torch.sin))
    slots = torch.randperm(tokens + 5, generator=gen)[:tokens]
    if skipped:
        slots[::2] = -1
    caches = [torch.zeros(tokens + 5, 1, kv_heads, head_dim, dtype=dtype) for _ in range(4)]
    q = cpu.rotary_store(qkv, cos, sin, heads, caches[0], caches[1], slots)
    ref_q = ref.rotary_store(qkv, cos, sin, heads, caches[2], caches[3], slots)
    assert q.shape == (tokens, heads, head_dim) and q.dtype == dtype and _close(q, ref_q)
    assert _close(caches[0], caches[2])
    assert torch.equal(caches[1], caches[3])  # values: copied


@settings(max_examples=30, deadline=None)
@given(rows=st.sampled_from([1, 5, 64, 300]), width=st.sampled_from([8, 100, 1536]),
       scale=st.floats(0.1, 60.0), dtype=DTYPES, seed=st.integers(0, 2**16))
def test_silu_mul_matches_reference(rows, width, scale, dtype, seed):
    """Large gates both ways: silu(-60) underflows to -0, silu(60) is the gate itself."""
    gen = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(rows, 2 * width, generator=gen) * scale).to(dtype)
    out = cpu.silu_mul(gate_up)
    assert out.dtype == dtype and _close(out, ref.silu_mul(gate_up))


@settings(max_examples=30, deadline=None)
@given(rows=st.sampled_from([1, 5, 64, 300]), width=st.sampled_from([8, 100, 1152]),
       scale=st.floats(0.1, 60.0), dtype=DTYPES, seed=st.integers(0, 2**16))
def test_gelu_tanh_mul_matches_reference(rows, width, scale, dtype, seed):
    """Gemma's GeGLU activation; large gates both ways (gelu(-60) is -0, gelu(60) the gate).
    Against the reference in float64: torch's float32 ``1 + tanh(u)`` cancels for gates
    below about -4 (an absolute error of an ulp of 1 times the gate), the kernel's
    ``g / (1 + e^-2u)`` does not."""
    gen = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(rows, 2 * width, generator=gen) * scale).to(dtype)
    out = cpu.gelu_tanh_mul(gate_up)
    expected = ref.gelu_tanh_mul(gate_up.double()).to(dtype)
    assert out.dtype == dtype and _close(out, expected)


def test_layer_kernels_leave_other_dtypes_to_the_reference():
    """float16 rows (and anything the C code does not take) get the reference's bits."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 64, generator=gen).half()
    weight = torch.randn(64, generator=gen).half()
    assert torch.equal(cpu.rms_norm(x, weight, 1e-5, x)[0], ref.rms_norm(x, weight, 1e-5, x)[0])
    assert torch.equal(cpu.silu_mul(x), ref.silu_mul(x))
    assert torch.equal(cpu.gelu_tanh_mul(x), ref.gelu_tanh_mul(x))
    cos = torch.randn(4, 16, generator=gen).half()
    caches = [torch.zeros(8, 1, 1, 16, dtype=torch.float16) for _ in range(4)]
    q = cpu.rotary_store(x[:, :48], cos, cos, 1, caches[0], caches[1], torch.arange(4))
    ref_q = ref.rotary_store(x[:, :48], cos, cos, 1, caches[2], caches[3], torch.arange(4))
    assert torch.equal(q, ref_q) and torch.equal(caches[0], caches[2])
    # mixed dtypes too
    assert torch.equal(cpu.rms_norm(x.float(), weight.bfloat16(), 1e-5)[0],
                       ref.rms_norm(x.float(), weight.bfloat16(), 1e-5)[0])


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, LINEAR_ROWS.stop + 2), k_dim=st.sampled_from([8, 100, 576]),
       n_dim=st.sampled_from([1, 7, 64, 961]), with_bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_linear_matches_reference(rows, k_dim, n_dim, with_bias, seed):
    """Any row count (eight-row passes and their remainder), widths with vector tails, an
    odd number of outputs (the last paired with itself)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k_dim, generator=gen)
    weight = torch.randn(n_dim, k_dim, generator=gen)
    bias = torch.randn(n_dim, generator=gen) if with_bias else None
    expected = ref.linear(x, weight, bias)
    assert torch.allclose(cpu.linear(x, weight, bias), expected, rtol=1e-5, atol=1e-4)
    # the C product itself at every row count, inside the dispatched range or not
    out = torch.empty(rows, n_dim)
    cpu.kernel_library().linear_f32(
        x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
        out.data_ptr(), rows, k_dim, n_dim, 2)
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(rows=st.sampled_from([0, 1, 2, 7, 16, 17, 33, 64, 65, 100, 257]),
       k_dim=st.sampled_from([8, 100, 576]), n_dim=st.sampled_from([1, 7, 64, 961]),
       with_bias=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       seed=st.integers(0, 2**16))
def test_linear_on_packed_weights_matches_reference(rows, k_dim, n_dim, with_bias, dtype,
                                                     seed):
    """A weight packed once (oneDNN's layout, where torch has it) gives F.linear's result at
    any row count, rounded up for oneDNN or not."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k_dim, generator=gen).to(dtype)
    weight = torch.randn(n_dim, k_dim, generator=gen).to(dtype)
    bias = torch.randn(n_dim, generator=gen).to(dtype) if with_bias else None
    expected = ref.linear(x, weight, bias)
    out = cpu.linear(x, cpu.pack_linear(weight), bias)
    assert out.shape == expected.shape and out.is_contiguous()
    tol = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2,
                                                                         "atol": 5e-2}
    assert torch.allclose(out.float(), expected.float(), **tol)


@pytest.mark.skipif(not _onednn(), reason="needs torch's oneDNN")
@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, BLOCKED_ROWS.stop + 2),
       shape=st.sampled_from([(961, 576), (576, 1536), (64, 100), (7, 8), (130, 33)]),
       with_bias=st.booleans(), threads=st.sampled_from([1, 2, 3]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16] if _onednn_bfloat16()
                             else [torch.float32]),
       seed=st.integers(0, 2**16))
def test_product_on_onednn_blocked_layout_matches_reference(rows, shape, with_bias, threads,
                                                             dtype, seed):
    """The C product reading oneDNN's packed layout, called directly: row groups and their
    remainder, partial 64-column blocks, column runs split between threads at any vector,
    input widths past one summation run (64), padded ones, odd ones (a bfloat16 pair
    half past the end)."""
    n_dim, k_dim = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k_dim, generator=gen).to(dtype)
    weight = torch.randn(n_dim, k_dim, generator=gen).to(dtype)
    bias = torch.randn(n_dim, generator=gen).to(dtype) if with_bias else None
    out = torch.full((rows, n_dim), float("nan"), dtype=dtype)
    packed = cpu.pack_linear(weight)
    k_padded = blocked_width(packed) if packed.is_mkldnn else None
    # a shape oneDNN lays out otherwise on this CPU is no example (a skip here would end
    # the whole test at the first such shape)
    assume(k_padded is not None)
    build.kernel("linear_blocked", x)(
        x.data_ptr(), torch.ops.mkldnn.data_ptr(packed),
        None if bias is None else bias.data_ptr(), out.data_ptr(), rows, k_dim, k_padded,
        n_dim, threads)
    if dtype == torch.float32:
        assert torch.allclose(out, ref.linear(x, weight, bias), rtol=1e-5, atol=1e-4)
    else:  # float32 sums of the bfloat16 products, rounded once: as F.linear, but its order
        exact = ref.linear(x.double(), weight.double(), None if bias is None else bias.double())
        assert torch.allclose(out.double(), exact, rtol=8e-3, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_this_models_layer_shapes_take_the_blocked_product(dtype):
    """Where the C product is built and torch has oneDNN, the model's layer weights are
    read by the C product (a layout check that failed would send them to oneDNN quietly)."""
    if not _onednn():
        pytest.skip("needs torch's oneDNN")
    if dtype == torch.bfloat16 and not _onednn_bfloat16():
        pytest.skip("oneDNN has no bfloat16 product on this CPU (AVX2): the weights stay plain")
    for n_dim, k_dim in [(960, 576), (576, 576), (3072, 576), (576, 1536)]:
        packed = cpu.pack_linear(torch.randn(n_dim, k_dim).to(dtype))
        assert blocked_width(packed) == k_dim


def test_a_weight_of_zeros_leaves_the_layout_check_to_the_next_of_its_shape():
    """Zeros multiply the same in any layout: such a weight goes to oneDNN, and the first
    real weight of its shape decides (a wrong layout must never pass for zeros)."""
    if not _onednn():
        pytest.skip("needs torch's oneDNN")
    zeros = cpu.pack_linear(torch.zeros(208, 48))
    assert blocked_width(zeros) is None
    x = torch.randn(2, 48)
    assert torch.equal(cpu.linear(x, zeros), torch.zeros(2, 208))
    assert blocked_width(cpu.pack_linear(torch.randn(208, 48))) == 48
    assert blocked_width(zeros) == 48


def test_onednn_row_counts_are_few_and_close():
    """Up to 16 rows go as they are; beyond, at most 12.5% padding and a few dozen distinct
    counts up to 1,024 rows, 8 per doubling (oneDNN builds and keeps a product per count)."""
    padded = [onednn_rows(rows) for rows in range(1, 1025)]
    assert padded[:16] == list(range(1, 17))
    for rows, count in enumerate(padded, start=1):
        assert rows <= count <= rows * 1.125 + 1
    assert len(set(padded[16:])) == 8 * 6  # 17-32, 33-64, ..., 513-1024


def test_pack_linear_leaves_what_it_cannot_pack():
    weight = torch.randn(4, 3, dtype=torch.float64)
    assert cpu.pack_linear(weight) is weight
    if _onednn():
        assert cpu.pack_linear(torch.randn(4, 3)).is_mkldnn


@settings(max_examples=30, deadline=None)
@given(shape=st.sampled_from([(961, 576), (64, 100), (7, 8), (130, 33), (200, 40)]),
       count=st.integers(0, 20).map(lambda half: 2 * half),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       seed=st.integers(0, 2**16))
def test_embedding_reads_rows_of_a_packed_tied_weight(shape, count, dtype, seed):
    """A tied head's weight, packed for the C product, still gives F.embedding's rows
    exactly: partial 64-row blocks, padded widths, odd ones (half a bfloat16 pair)."""
    vocab, width = shape
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, width, generator=gen).to(dtype)
    ids = torch.cat([torch.tensor([0, vocab - 1]), torch.randint(0, vocab, (count,),
                                                                 generator=gen)])
    packed = cpu.pack_embedding(weight)
    assert packed is weight or (packed.is_mkldnn and blocked_width(packed) is not None)
    assert torch.equal(cpu.embedding(ids, packed), ref.embedding(ids, weight))
    assert torch.equal(cpu.embedding(ids.view(2, -1), packed), weight[ids.view(2, -1)])
    with pytest.raises(IndexError):
        cpu.embedding(torch.tensor([vocab]), packed)


def test_a_packed_embedding_still_reads_after_the_level_switches():
    """set_isa forgets the layouts it checked; a weight packed before still gives its rows."""
    weight = torch.randn(200, 64)
    packed = cpu.pack_embedding(weight)
    ids = torch.tensor([0, 199, 7, 7])
    try:
        cpu.set_isa(build.runnable_isas()[0])
        assert torch.equal(cpu.embedding(ids, packed), weight[ids])
    finally:
        cpu.set_isa(None)


def test_pack_embedding_packs_only_what_the_lookup_can_read():
    weight = torch.randn(70, 40, dtype=torch.float64)
    assert cpu.pack_embedding(weight) is weight
    if _onednn():
        packed = cpu.pack_embedding(torch.randn(70, 40))
        assert packed.is_mkldnn and blocked_width(packed) is not None


@pytest.mark.parametrize("rows", [1, 16, 17, 256, 257])
@pytest.mark.parametrize("packed", [True, False])
def test_linear_writes_into_out_on_every_path(rows, packed):
    """The head's logits go to a buffer kept from step to step: every product (the C ones,
    oneDNN's, the reference) returns ``out`` itself, holding what it returns without."""
    gen = torch.Generator().manual_seed(rows)
    x, weight = torch.randn(rows, 72, generator=gen), torch.randn(130, 72, generator=gen)
    if packed:
        weight = cpu.pack_linear(weight)
    buffer = torch.full((rows + 3, 130), float("nan"))
    result = cpu.linear(x, weight, out=buffer[:rows])
    assert result.data_ptr() == buffer.data_ptr()
    assert torch.equal(result, cpu.linear(x, weight))
    assert buffer[rows:].isnan().all()
    with pytest.raises(ValueError, match="out"):
        cpu.linear(x, weight, out=buffer[:rows, :129])
    reference_out = torch.empty(rows, 130)
    plain = torch.randn(130, 72, generator=gen)
    assert torch.equal(ref.linear(x, plain, out=reference_out), ref.linear(x, plain))
    bias = torch.randn(130, generator=gen)
    assert torch.equal(ref.linear(x, plain, bias, out=reference_out), ref.linear(x, plain, bias))
