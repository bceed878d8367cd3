"""One row of x times Q4_K / Q6_K on AVX2 and AVX-512 (quant_split.c): x split per group of
256 into three 8-bit terms on power-of-two scales. Its contract: each value of x is kept to
2^-21 of its group's largest, and the rest is exact integer arithmetic, so that the product
stays within float32's reach of the exact one, even where a group holds an outlier."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_quant import kernels, library, random_weight  # noqa: F401

WIDTH = 1024


def exact_product(x: torch.Tensor, weight) -> tuple[torch.Tensor, torch.Tensor]:
    """x . W in float64 from the reference's weights, and each output's error allowance:
    2^-21 of the group's largest |x| per weight (the split) plus float32 sums' rounding."""
    from pagedchat.kernels import quant

    w = quant.dequantize(weight).double()
    group_max = x.double().abs().reshape(-1, 256).amax(1).repeat_interleave(256)
    allowance = 2.0 ** -21 * (w.abs() @ group_max) + 2e-6 * (w.abs() @ x.double().abs()[0])
    return x.double() @ w.T, allowance


def activations(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, WIDTH, generator=g)
    if kind == "outliers":  # a few channels 1000x the rest, as LLM activations hold
        x[0, torch.randint(0, WIDTH, (6,), generator=g)] *= 1000.0
    elif kind == "wide":  # every magnitude from 1e-3 to 1e3
        x *= 10.0 ** (torch.rand(1, WIDTH, generator=g) * 6 - 3)
    elif kind == "zero group":
        x[0, 256:512] = 0.0
    return x


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("kind", ["normal", "outliers", "wide", "zero group"])
def test_one_row_k_quant_product_keeps_float32_precision(kernels, name, kind):
    weight = random_weight(name, 37, WIDTH, seed=3)
    x = activations(kind)
    expected, allowance = exact_product(x, weight)
    error = (kernels.quantized_linear(x, weight).double() - expected).abs()
    assert bool((error <= allowance).all()), f"worst excess {(error / allowance).max():.2f}x"


def test_the_allowance_is_tight_enough_to_tell_two_terms_from_three():
    """The allowance above would not pass a split of two terms (2^-14 of a group's largest):
    rounding x so, as a two-term split would, exceeds it."""
    weight = random_weight("Q4_K", 37, WIDTH, seed=3)
    x = activations("normal")
    expected, allowance = exact_product(x, weight)
    group_max = x.abs().reshape(-1, 256).amax(1).repeat_interleave(256)
    unit = 2.0 ** torch.ceil(torch.log2(group_max / 127)) / 128  # the second term's step
    rounded = torch.round(x / unit) * unit
    from pagedchat.kernels import quant

    error = (rounded.double() @ quant.dequantize(weight).double().T - expected).abs()
    assert bool((error > allowance).any())
