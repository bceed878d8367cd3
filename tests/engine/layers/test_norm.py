"""RMSNorm against transformers' own: the reference kernel bit for bit."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from pagedchat.kernels import reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 576, 2048])
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_rms_norm_is_bit_identical_to_transformers(dtype, hidden, rows):
    generator = torch.Generator().manual_seed(hidden + rows)
    theirs = LlamaRMSNorm(hidden, eps=1e-5)
    weight = torch.randn(hidden, generator=generator)
    with torch.no_grad():
        theirs.weight.copy_(weight)
    theirs, weight = theirs.to(dtype), weight.to(dtype)
    for scale in (1e-3, 1.0, 40.0):
        x = (torch.randn(rows, hidden, generator=generator) * scale).to(dtype)
        residual = (torch.randn(rows, hidden, generator=generator) * scale).to(dtype)
        with torch.no_grad():
            out, total = reference.rms_norm(x, weight, 1e-5)
            assert torch.equal(out, theirs(x)) and total is x
            # the residual add folded in: transformers adds, then normalises
            out, total = reference.rms_norm(x, weight, 1e-5, residual)
            assert torch.equal(total, residual + x)
            assert torch.equal(out, theirs(residual + x))
