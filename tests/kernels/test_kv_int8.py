"""8-bit KV caches (kernels/kv_int8.py): the quantization itself, and the CPU kernels that
store and read int8 rows against the reference on the same rows (tight), and against float
caches (loose: the rounding of K and V), on every instruction-set level this CPU runs."""

from __future__ import annotations

import functools

import pytest
import torch
from guarded import EDGES
from paged_cases import TOL, guarded_blocks, paged_batch, rel_err

from pagedchat.kernels import cpu
from pagedchat.kernels import reference as ref
from pagedchat.kernels.cpu import attention
from pagedchat.kernels.cpu import build as cpu_build
from pagedchat.kernels.kv_int8 import SCALE_BYTES, dequantize, head_dim_of, quantize

needs_kernels = pytest.mark.skipif(cpu.kernel_library() is None, reason="no C compiler")
INT8 = torch.int8


@pytest.fixture(params=cpu_build.runnable_isas())
def isa(request):
    """A test on each level in turn: the dispatch calls that level's library."""
    cpu.set_isa(request.param)
    yield request.param
    cpu.set_isa(None)


def test_quantize_keeps_each_value_within_half_a_step_of_its_head():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, 64, generator=gen) * torch.logspace(-3, 3, 50)[:, None, None]
    x[0, 0] = 0.0  # a head of zeros: scale 0, values 0
    rows = quantize(x)
    assert rows.dtype == INT8 and rows.shape == (50, 3, 64 + SCALE_BYTES)
    assert head_dim_of(rows) == 64 and head_dim_of(x) == 64
    back = dequantize(rows)
    scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float16).float()
    assert torch.equal(back[0, 0], torch.zeros(64))
    assert bool(((back - x).abs() <= 0.5 * scale * (1 + 1e-3)).all())
    assert int(rows[..., :-SCALE_BYTES].abs().max()) == 127  # each head's peak is +-127
    assert torch.equal(quantize(x.bfloat16()), quantize(x.bfloat16().float()))


def test_quantize_rounds_ties_to_even():
    # peak 127 gives scale 1 exactly: 0.5 and 2.5 are ties, to 0 and 2; -1.5 to -2
    x = torch.tensor([127.0, 0.5, 2.5, -1.5, 3.5])
    assert rows_values(quantize(x)) == [127, 0, 2, -2, 4]


def rows_values(rows: torch.Tensor) -> list[int]:
    return rows[..., :-SCALE_BYTES].tolist()


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("kv_heads", "head_dim", "skipped"),
                         [(2, 16, False), (3, 64, True), (1, 256, False)])
def test_rotary_store_writes_the_references_int8_rows(isa, dtype, kv_heads, head_dim,
                                                      skipped):
    """Values are copied, so their int8 rows are the reference's byte for byte; keys are
    rotated a few ulps apart from torch (bfloat16: an ulp or two of the head's peak, 127
    steps), so theirs agree to within a step more than that; a -1 slot is left alone."""
    gen = torch.Generator().manual_seed(head_dim)
    tokens, heads = 40, 3 * kv_heads
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    angles = torch.rand(tokens, head_dim // 2, generator=gen) * 100
    cos, sin = (torch.cat([f(angles)] * 2, dim=1).to(dtype) for f in (torch.cos, torch.sin))
    slots = torch.randperm(tokens + 5, generator=gen)[:tokens]
    if skipped:
        slots[::2] = -1
    caches = [torch.full((tokens + 5, 1, kv_heads, head_dim + SCALE_BYTES), 7, dtype=INT8)
              for _ in range(4)]
    q = cpu.rotary_store(qkv, cos, sin, heads, *caches[:2], slots)
    ref_q = ref.rotary_store(qkv, cos, sin, heads, *caches[2:], slots)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert torch.allclose(q.float(), ref_q.float(), rtol=tol, atol=tol)
    assert torch.equal(caches[1], caches[3])
    keys, ref_keys = dequantize(caches[0]), dequantize(caches[2])
    step = caches[2][..., -SCALE_BYTES:].contiguous().view(torch.float16).float()
    ulps = 127 * 2 * 2.0 ** -8 if dtype == torch.bfloat16 else 0.0
    assert bool(((keys - ref_keys).abs() <= step * (1.01 + ulps)).all())
    if skipped:
        assert bool((caches[0][slots[::2][slots[::2] >= 0]] == 7).all())


@functools.lru_cache(maxsize=16)
def int8_case(context_lens, query_lens, block_size, heads, kv_heads, head_dim, dtype, seed):
    """A paged batch on int8 caches, the same batch on float caches, and the reference on
    each (kept for the next level)."""
    shape = (list(context_lens), list(query_lens), block_size, heads, kv_heads, head_dim,
             dtype, seed)
    batch, plain = paged_batch(*shape, kv_dtype=INT8), paged_batch(*shape)
    scale = head_dim ** -0.5
    return (batch, ref.paged_attention(**batch, scale=scale),
            ref.paged_attention(**plain, scale=scale))


def check(batch, expected, on_float, dtype):
    out = cpu.paged_attention(**batch, scale=batch["query"].shape[-1] ** -0.5)
    assert rel_err(out, expected) < TOL[dtype]
    assert rel_err(out, on_float) < 0.05  # the rounding of K and V to 8 bits


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("group", "head_dim", "block_size"),
                         [(1, 64, 16), (3, 64, 1), (8, 128, 256), (2, 256, 16), (2, 80, 5)])
def test_decode_on_int8_caches_matches_reference(isa, group, head_dim, block_size, dtype):
    """Decodes and short chunks (the row-by-row kernel, its vector tiles and, for a head
    of 80, its scalar path)."""
    kv_heads = 2 if group < 8 else 1
    check(*int8_case((1, 7, 33, 300), (1, 1, 5, 1), block_size, kv_heads * group, kv_heads,
                     head_dim, dtype, seed=head_dim + group), dtype)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("group", "head_dim"), [(3, 64), (4, 256)])
def test_prompt_chunks_on_int8_caches_match_reference(isa, monkeypatch, group, head_dim,
                                                      dtype):
    """Long chunks through the chunked-prefill kernel, which de-quantizes as it gathers."""
    monkeypatch.setattr(attention, "_sdpa", lambda *args: pytest.fail("SDPA was used"))
    check(*int8_case((300, 90, 9), (300, 61, 1), 16, 2 * group, 2, head_dim, dtype,
                     seed=group), dtype)


@needs_kernels
def test_prompt_chunks_on_int8_caches_take_sdpa_where_the_kernel_does_not(monkeypatch):
    """A head of 72 goes to SDPA, on the de-quantized context."""
    calls = []
    sdpa = attention._sdpa
    monkeypatch.setattr(attention, "_sdpa", lambda *args: calls.append(1) or sdpa(*args))
    for dtype in (torch.float32, torch.bfloat16):
        check(*int8_case((40, 12), (20, 1), 16, 4, 2, 72, dtype, seed=1), dtype)
    assert len(calls) == 2


@needs_kernels
@pytest.mark.parametrize("edge", EDGES)
@pytest.mark.parametrize(("block_size", "head_dim"), [(16, 64), (5, 80), (1, 64)])
def test_attention_on_int8_caches_reads_only_the_blocks_it_is_given(isa, edge, block_size,
                                                                    head_dim):
    """A pool of just the named blocks against an unreadable page, the last block full to
    its last slot's scale: a decode, a short chunk and a long one read nothing outside."""
    contexts = [3 * block_size, 12 + block_size, 2 * block_size + 3]
    batch = paged_batch(contexts, [1, 12, 3], block_size, 4, 2, head_dim, torch.float32,
                        seed=5, kv_dtype=INT8)
    guarded = guarded_blocks(batch, contexts, block_size, edge)
    expected = ref.paged_attention(**batch, scale=head_dim ** -0.5)
    out = cpu.paged_attention(**guarded, scale=head_dim ** -0.5)
    assert rel_err(out, expected) < TOL[torch.float32]


def test_block_copies_and_swaps_carry_the_scales():
    """Copy-on-write and swaps move whole int8 rows, scales included."""
    pool = quantize(torch.randn(6, 4, 2, 16))
    host = torch.zeros_like(pool)
    ref.swap_blocks(pool, host, torch.tensor([[1, 0], [4, 3]]))
    assert torch.equal(host[0], pool[1]) and torch.equal(host[3], pool[4])
    ref.copy_blocks([pool], [pool.clone()], torch.tensor([[2, 5]]))
    assert torch.equal(dequantize(pool[5]), dequantize(pool[2]))
