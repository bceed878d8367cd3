"""Layers of our Llama against transformers' own, bit for bit."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from pagedchat.engine.models.llama import RMSNorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 576, 2048])
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_rms_norm_is_bit_identical_to_transformers(dtype, hidden, rows):
    generator = torch.Generator().manual_seed(hidden + rows)
    ours, theirs = RMSNorm(hidden, 1e-5), LlamaRMSNorm(hidden, eps=1e-5)
    weight = torch.randn(hidden, generator=generator)
    with torch.no_grad():
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    for scale in (1e-3, 1.0, 40.0):
        x = (torch.randn(rows, hidden, generator=generator) * scale).to(dtype)
        with torch.no_grad():
            assert torch.equal(ours(x), theirs(x))
