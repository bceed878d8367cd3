"""Gemma 3 and Qwen 3 through the CPU backend's one-call decoder stack: every step of a run
both ways (the stack, then the layers one by one), equal bit for bit, K/V writes included,
on a tiny random Gemma 3 whose prompts cross its sliding window and a tiny Qwen 3 (QK
norms); and Gemma 3's greedy tokens equal transformers ``generate``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.engine.layers.linear import Linear
from pagedchat.kernels import cpu
from pagedchat.kernels.cpu.linear import _onednn, blocked_width
from pagedchat.kernels.quant import QuantizedWeight
from tests.conftest import SMALL_VOCAB_SIZE, build_tiny_tokenizer
from tests.engine.models.test_decoder_stack import _quantized
from tests.engine.models.test_folder_families import _model
from tests.engine.models.test_gemma3 import prompts, reference, save_tiny_gemma3

needs_kernels = pytest.mark.skipif(cpu.kernel_library() is None,
                                   reason="the stack needs the C kernels")
needs_stack = pytest.mark.skipif(
    not (cpu.kernel_library() is not None and _onednn()),
    reason="the stack on float weights needs the C kernels and torch's oneDNN")


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3-stack"), tiny_tokenizer)


def _quantize(model, folder: Path) -> None:
    """The products replaced by the checkpoint's in Q8_0 (q/k/v, gate/up fused from their
    parts) and Q4_0 (o, down), kept in their blocks as the GGUF path loads them."""
    from safetensors.torch import load_file

    state = load_file(folder / "model.safetensors")
    for i, layer in enumerate(model.layers):
        def part(name: str, kind: str, i: int = i) -> QuantizedWeight:
            return _quantized(state[f"model.layers.{i}.{name}.weight"], kind)
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj.load(QuantizedWeight.stack(
            [part(f"self_attn.{n}_proj", "Q8_0") for n in "qkv"]))
        attn.o_proj.load(part("self_attn.o_proj", "Q4_0"))
        mlp.gate_up_proj.load(QuantizedWeight.stack(
            [part(f"mlp.{n}_proj", "Q8_0") for n in ("gate", "up")]))
        mlp.down_proj.load(part("mlp.down_proj", "Q4_0"))


def _require_stack(model):
    """The model's decoder stack. Skips where oneDNN packs a float weight of this model in
    another layout than the blocked one the stack reads (it picks its layout per CPU: on
    AVX2-only CPUs these small shapes), where the engine runs the layers one by one."""
    stack = model.decoder_stack()
    unread = [name for name, module in model.named_modules()
              if isinstance(module, Linear) and module.quantized is None
              and module.weight.is_mkldnn and blocked_width(module.weight) is None]
    if stack is None and unread:
        pytest.skip(f"oneDNN's layout of {unread[0]} on this CPU is not the blocked one")
    assert stack is not None
    return stack


def _run_both_ways(llm: LLM, monkeypatch, prompt_sets: list[list[int]],
                   max_tokens: int) -> tuple[list[list[int]], list[int]]:
    """Greedy tokens of a run whose every forward runs through the stack and through the
    layers (the layers' result kept), asserting the two equal; and the row counts of the
    steps the stack took."""
    model = llm.engine.runner.model
    _require_stack(model)
    build, forward = model.decoder_stack, model.forward
    use_stack, taken = [True], []

    def stack_or_none():
        stack = build()
        if not use_stack[0]:
            return None

        def counted(x, *args):
            out = stack(x, *args)
            if out is not None:
                taken.append(x.shape[0])
            return out
        return counted

    def both(*args, **kwargs):
        attns = [layer.self_attn for layer in model.layers]
        before = [(a.k_cache.clone(), a.v_cache.clone()) for a in attns]
        use_stack[0] = True
        stacked = forward(*args, **kwargs)
        stacked_caches = [(a.k_cache.clone(), a.v_cache.clone()) for a in attns]
        for a, (k, v) in zip(attns, before, strict=True):
            a.k_cache.copy_(k)
            a.v_cache.copy_(v)
        use_stack[0] = False
        layered = forward(*args, **kwargs)
        assert torch.equal(stacked, layered)
        for a, (k, v) in zip(attns, stacked_caches, strict=True):
            assert torch.equal(a.k_cache, k) and torch.equal(a.v_cache, v)
        return layered

    monkeypatch.setattr(model, "decoder_stack", stack_or_none)
    monkeypatch.setattr(model, "forward", both)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = [out.outputs[0].token_ids for out in llm.generate(prompt_sets, params)]
    return outs, taken


@pytest.mark.parametrize(("weights", "dtype", "kv"), [
    pytest.param("float", "float32", "auto", marks=needs_stack),
    pytest.param("float", "float32", "int8", marks=needs_stack),
    pytest.param("quantized", "float32", "auto", marks=needs_kernels),
    pytest.param("quantized", "bfloat16", "auto", marks=needs_kernels),
])
def test_stack_gives_the_layers_result_bit_for_bit(gemma_dir, monkeypatch, weights, dtype,
                                                   kv):
    """Decode steps of one to six rows over local layers' windows (prompts of 3 to 90
    tokens, window 16, blocks of 4: pages that slid out are gone) and global layers'
    whole context: the stack's hidden states and K/V writes equal the layers' exactly."""
    llm = LLM(model=str(gemma_dir), num_kv_blocks=256, block_size=4, dtype=dtype,
              kv_cache_dtype=kv, max_num_batched_tokens=64)
    if weights == "quantized":
        _quantize(llm.engine.runner.model, gemma_dir)
    outs, taken = _run_both_ways(llm, monkeypatch, prompts(), 20)
    assert all(len(out) == 20 for out in outs)
    assert len(set(taken)) >= 3 and max(taken) == len(prompts())


@needs_stack
def test_stack_greedy_matches_transformers(gemma_dir):
    """The engine as it runs (decode steps through the stack) gives transformers' tokens."""
    batch = prompts()
    expected = reference(gemma_dir, batch, 24)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with LLM(model=str(gemma_dir), num_kv_blocks=256, block_size=16) as llm:
        model = llm.engine.runner.model
        stack = _require_stack(model)
        calls = []
        original = type(stack).__call__

        def counted(self, x, *args):
            out = original(self, x, *args)
            calls.append(out is not None)
            return out

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(type(stack), "__call__", counted)
            got = [out.outputs[0].token_ids for out in llm.generate(batch, params)]
    assert sum(calls) >= 20
    assert got == expected


@needs_stack
def test_qwen3_stack_gives_the_layers_result_bit_for_bit(tmp_path, monkeypatch):
    """Qwen 3's per-head norms of Q and K (plain RMSNorm) in the stack."""
    _model("qwen3").save_pretrained(tmp_path)
    build_tiny_tokenizer(SMALL_VOCAB_SIZE).save_pretrained(tmp_path)
    llm = LLM(model=str(tmp_path), block_size=4, num_kv_blocks=128)
    assert llm.engine.runner.model.layers[0].self_attn.q_norm is not None
    outs, taken = _run_both_ways(llm, monkeypatch, prompts(), 12)
    assert all(len(out) == 12 for out in outs) and max(taken) == len(prompts())
