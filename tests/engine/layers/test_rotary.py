"""Rotary embedding against transformers' own: the reference kernel bit for bit, at any
position (cos and sin are computed for each step's positions, as transformers does)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from pagedchat.engine.model_config import ModelConfig
from pagedchat.engine.models.llama import LlamaForCausalLM
from pagedchat.kernels import reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_is_bit_identical_to_transformers(tiny_model_dir, dtype):
    config = ModelConfig.from_folder(tiny_model_dir)
    with torch.device("meta"):
        model = LlamaForCausalLM(config, reference)
    model.build_rotary()
    theirs = LlamaRotaryEmbedding(config=_hf_config(tiny_model_dir))
    positions = torch.cat([torch.tensor([0, 5, 17, 63, 2]), torch.arange(100, 140_000, 997)])
    heads, dim = 3, config.head_dim
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(len(positions), heads, dim, generator=generator).to(dtype)
    k = torch.randn(len(positions), heads, dim, generator=generator).to(dtype)
    cos, sin = model.rotary.lookup(positions, dtype)
    their_cos, their_sin = theirs(q, positions.unsqueeze(0))
    # transformers rotates [batch, heads, tokens, dim]; ours is [tokens, heads, dim]
    their_q, their_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                            their_cos.to(dtype), their_sin.to(dtype))
    assert torch.equal(reference.rotary(q, cos, sin), their_q[0].transpose(0, 1))
    assert torch.equal(reference.rotary(k, cos, sin), their_k[0].transpose(0, 1))


def _hf_config(folder):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)
