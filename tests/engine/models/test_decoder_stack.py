"""The CPU backend's one-call decoder stack against the model's layers called one by one."""

from __future__ import annotations

import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.kernels import cpu

needs_stack = pytest.mark.skipif(
    not (cpu.kernel_library() is not None and cpu._onednn()),
    reason="the stack needs the AVX-512 C kernels and torch's oneDNN")


@needs_stack
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stack_gives_the_layers_result_bit_for_bit(tiny_model_dir, monkeypatch, dtype):
    """Every step runs both ways: decode steps (one to six rows, one with a short prompt
    chunk beside them) through the stack must equal the layers exactly, K/V writes
    included; steps with a long prompt chunk are left to the layers."""
    llm = LLM(model=str(tiny_model_dir), num_kv_blocks=128, block_size=16,
              max_num_batched_tokens=64, dtype=dtype)
    model = llm.engine.runner.model
    stack = model.decoder_stack()
    assert stack is not None
    taken, left = [], []

    def both(input_ids, positions, meta):
        x = model.embed_tokens(input_ids)
        rope = model.rotary.lookup(positions, x.dtype)
        caches = [(layer.self_attn.k_cache.clone(), layer.self_attn.v_cache.clone())
                  for layer in model.layers]
        stacked = stack(x.clone(), *rope, meta.slot_mapping, meta.block_tables,
                        meta.context_lens, meta.query_start_loc)
        stacked_caches = [(layer.self_attn.k_cache.clone(), layer.self_attn.v_cache.clone())
                          for layer in model.layers]
        for layer, (k, v) in zip(model.layers, caches, strict=True):
            layer.self_attn.k_cache.copy_(k)
            layer.self_attn.v_cache.copy_(v)
        residual = None
        for layer in model.layers:
            x, residual = layer(x, residual, rope, meta)
        if stacked is None:
            left.append(meta.max_query_len)
        else:
            taken.append((len(input_ids), meta.max_query_len))
            assert torch.equal(stacked[0], x) and torch.equal(stacked[1], residual)
            for layer, (k, v) in zip(model.layers, stacked_caches, strict=True):
                assert torch.equal(layer.self_attn.k_cache, k)
                assert torch.equal(layer.self_attn.v_cache, v)
        return x + residual

    monkeypatch.setattr(model, "forward", both)
    gen = torch.Generator().manual_seed(3)
    lengths = {"a": (3, 12), "b": (40, 6), "c": (90, 9), "d": (17, 15), "e": (2, 11),
               "late": (5, 4)}  # a short prompt that arrives while the others decode
    finished, step = {}, 0
    while step == 0 or llm.engine.has_unfinished_requests():
        for name, (length, max_tokens) in lengths.items():
            if step == (4 if name == "late" else 0):
                llm.engine.add_request(
                    name, torch.randint(3, 49000, (length,), generator=gen).tolist(),
                    SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        for output in llm.engine.step():
            if output.finished:
                finished[output.request_id] = len(output.outputs[0].token_ids)
        step += 1
    assert finished == {name: max_tokens for name, (_, max_tokens) in lengths.items()}
    assert len({rows for rows, _ in taken}) >= 4
    assert any(1 < longest < cpu.PREFILL_MIN_QUERY_LEN for _, longest in taken)
    assert left and min(left) >= cpu.PREFILL_MIN_QUERY_LEN


@needs_stack
def test_stack_leaves_large_steps_and_other_dtypes_to_the_layers(tiny_model_dir):
    """More rows than the blocked product takes go to the layers, and so does a type with no
    C kernels (float16)."""
    llm = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16)
    model = llm.engine.runner.model
    rows = cpu.BLOCKED_ROWS.stop
    x = torch.zeros(rows, model.config.hidden_size)
    cos = sin = torch.zeros(rows, model.config.head_dim)
    ids = torch.arange(rows, dtype=torch.int32)
    assert model.decoder_stack()(x, cos, sin, ids, ids[:, None], ids + 1,
                                 torch.arange(rows + 1, dtype=torch.int32)) is None
    half = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16, dtype="float16")
    assert half.engine.runner.model.decoder_stack() is None
    assert half.generate([[5, 6, 7]], SamplingParams(max_tokens=3))[0].outputs[0].token_ids
