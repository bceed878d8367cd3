"""The greedy head: the token the whole exact head picks, from an 8-bit screen and the
exact logits of its candidates; its bound always holds. On the reference backend and on
every level of the compiled one."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedchat.engine.layers import greedy_head
from pagedchat.engine.layers.greedy_head import FasterWay, GreedyHead
from pagedchat.kernels import cpu
from pagedchat.kernels import reference as ref
from pagedchat.kernels.cpu import build as cpu_build
from pagedchat.kernels.quant import QuantizedWeight, quantize_q8_0

BACKENDS = ["reference", *(f"cpu-{level}" for level in cpu_build.runnable_isas()
                           if cpu.kernel_library() is not None)]


@pytest.fixture(scope="module", params=BACKENDS)
def kernels(request):
    if request.param == "reference":
        yield ref
        return
    cpu.set_isa(request.param.removeprefix("cpu-"))
    yield cpu
    cpu.set_isa(None)


def _head(vocab: int, width: int, gen: torch.Generator) -> QuantizedWeight:
    """Rows of very different norms, as a real vocabulary's (rare tokens near zero)."""
    scales = torch.rand(vocab, 1, generator=gen) ** 3 * 0.2
    return quantize_q8_0(torch.randn(vocab, width, generator=gen) * scales)


def _hidden(rows: int, width: int, gen: torch.Generator, outliers: float) -> torch.Tensor:
    """Hidden states with a few outlier dimensions, which make whole runs of 32 round
    coarsely to 8 bits."""
    x = torch.randn(rows, width, generator=gen)
    x[:, torch.randint(0, width, (3,), generator=gen)] *= outliers
    return x


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 12), vocab=st.integers(1, 600), blocks=st.integers(1, 5),
       outliers=st.floats(1.0, 200.0), seed=st.integers(0, 2**16))
def test_tokens_are_the_whole_heads_argmax_and_the_bound_holds(kernels, rows, vocab, blocks,
                                                               outliers, seed):
    gen = torch.Generator().manual_seed(seed)
    weight = _head(vocab, 32 * blocks, gen)
    x = _hidden(rows, 32 * blocks, gen, outliers)
    head = GreedyHead(weight, kernels)
    exact = kernels.quantized_linear(x, weight)
    approx = kernels.quantized_linear(x, head.int8_weight)
    assert ((approx - exact).abs() <= head.norms * head.slack(x).unsqueeze(1)).all()
    assert torch.equal(head.tokens(x), exact.argmax(dim=1))


def test_equal_and_nearly_equal_rows_keep_the_first_maximum(kernels):
    """Ties the 8-bit screen cannot see apart: the exact logits decide, the first of equal
    maxima wins, as argmax."""
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(300, 64, generator=gen) * 0.05
    table[200] = table[40] = table[7] * 1.5  # one exact three-way tie, likely the maximum
    table[201] = table[7] * 1.5 * (1 + 2.0 ** -10)  # a hair above it on x's side
    weight = quantize_q8_0(table)
    x = table[7].unsqueeze(0).repeat(9, 1) + 0.01 * torch.randn(9, 64, generator=gen)
    x[1::2] = -x[1::2]  # there the tie is the minimum
    head = GreedyHead(weight, kernels)
    expected = kernels.quantized_linear(x, weight).argmax(dim=1)
    assert torch.equal(head.tokens(x), expected)
    assert set(expected[::2].tolist()) <= {7, 40, 200, 201}
    # a decode step's one row takes its own way through the candidates
    assert [int(head.tokens(row.unsqueeze(0))) for row in x] == expected.tolist()


def test_rows_with_too_many_candidates_take_the_whole_head(kernels, monkeypatch):
    gen = torch.Generator().manual_seed(2)
    table = torch.randn(400, 64, generator=gen) * 0.01
    table[100:] = table[100] * 5  # 300 equal rows, the maximum in some rows of x
    weight = quantize_q8_0(table)
    x = _hidden(9, 64, gen, 100.0)
    head = GreedyHead(weight, kernels)
    monkeypatch.setattr(greedy_head, "CAPACITY", 2)
    approx = kernels.quantized_linear(x, head.int8_weight)
    counts = kernels.screen_candidates(approx, head.norms, head.slack(x), 2)[1]
    assert (counts > 2).any()
    assert torch.equal(head.tokens(x), kernels.quantized_linear(x, weight).argmax(dim=1))


def test_only_q8_0_heads_are_screened():
    gen = torch.Generator().manual_seed(3)
    q8 = _head(64, 32, gen)
    assert GreedyHead.supports(q8)
    assert not GreedyHead.supports(torch.randn(64, 32))
    q4 = QuantizedWeight.from_blocks("Q4_0", torch.zeros(64, 18, dtype=torch.uint8), 32)
    assert not GreedyHead.supports(q4)
    with pytest.raises(ValueError, match="Q8_0"):
        GreedyHead(q4, ref)


def test_faster_way_times_both_in_turn_then_keeps_the_faster_per_batch_size():
    way = FasterWay(trials=3)
    speeds = {(1, True): 2.0, (1, False): 1.0, (40, True): 1.0, (40, False): 3.0}
    for rows in (1, 40):
        tried = []
        for _ in range(6):
            screen = way.screen(rows)
            tried.append(screen)
            way.took(rows, screen, speeds[rows, screen])
        assert tried == [False, True] * 3  # in turn, the whole head first
    assert [way.screen(1) for _ in range(3)] == [False] * 3
    assert way.screen(40) and way.screen(33) and way.screen(63)  # one size class
    assert not way.screen(64)  # another, still on trial: the whole head first
