"""The CPU backend's one-call decoder stack against the model's layers called one by one,
on packed float weights and on weights kept quantized."""

from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import pytest
import torch
from safetensors.torch import load_file

from pagedchat import LLM, SamplingParams
from pagedchat.engine.layers.attention import AttentionMetadata
from pagedchat.kernels import cpu
from pagedchat.kernels.cpu import attention as cpu_attention
from pagedchat.kernels.cpu.decoder import QUANTIZED_ROWS
from pagedchat.kernels.cpu.linear import BLOCKED_ROWS, _onednn, _onednn_bfloat16
from pagedchat.kernels.quant import QFormat, QuantizedWeight, Segment

needs_stack = pytest.mark.skipif(
    not (cpu.kernel_library() is not None and _onednn()),
    reason="the stack needs the C kernels and torch's oneDNN")
# float bfloat16 weights reach the stack packed by oneDNN, which packs bfloat16 only on
# CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; elsewhere the layers run one by one
needs_bfloat16_stack = pytest.mark.skipif(
    not (cpu.kernel_library() is not None and _onednn() and _onednn_bfloat16()),
    reason="oneDNN does not pack bfloat16 weights on this CPU")
needs_kernels = pytest.mark.skipif(cpu.kernel_library() is None,
                                   reason="the stack needs the C kernels")


# Each layer's projections in GGML formats: layer 0's fused q/k/v and gate/up mix formats
# (several segments, as llama.cpp may write them), layer 1 is all Q4_1 (the default model's)
LAYER_FORMATS = [
    {"q": "Q4_0", "k": "Q8_0", "v": "Q5_0", "o": "Q4_1", "gate": "Q8_0", "up": "Q4_1",
     "down": "Q5_1"},
    dict.fromkeys(("q", "k", "v", "o", "gate", "up", "down"), "Q4_1"),
]


def _quantized(weight: torch.Tensor, name: str) -> QuantizedWeight:
    """``weight`` quantized by gguf-py, as llama.cpp's converter stores it."""
    blocks = gguf.quants.quantize(weight.float().numpy(), gguf.GGMLQuantizationType[name])
    return QuantizedWeight.from_blocks(name, torch.from_numpy(blocks), weight.shape[1])


def _quantize(model, folder: Path) -> None:
    """The model's products replaced by the checkpoint's weights in LAYER_FORMATS, kept in
    their blocks (as the GGUF path loads them); norms, embedding and caches unchanged."""
    state = load_file(folder / "model.safetensors")
    for i, (layer, formats) in enumerate(zip(model.layers, LAYER_FORMATS, strict=True)):
        parts = {name: _quantized(state[f"model.layers.{i}.{module}.{name}_proj.weight"],
                                  formats[name])
                 for module, names in (("self_attn", "qkvo"), ("mlp", ("gate", "up", "down")))
                 for name in names}
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj.load(QuantizedWeight.stack([parts[n] for n in "qkv"]))
        attn.o_proj.load(parts["o"])
        mlp.gate_up_proj.load(QuantizedWeight.stack([parts["gate"], parts["up"]]))
        mlp.down_proj.load(parts["down"])
    model.quantized = True
    assert [s.format.name for s in model.layers[0].self_attn.qkv_proj.quantized.segments] == \
        ["Q4_0", "Q8_0", "Q5_0"]


def _engine(source: str, dtype: str, folder: Path, kv_cache_dtype: str = "auto") -> LLM:
    llm = LLM(model=str(folder), num_kv_blocks=128, block_size=16, max_num_batched_tokens=64,
              dtype=dtype, kv_cache_dtype=kv_cache_dtype)
    if source.startswith("quantized"):
        _quantize(llm.engine.runner.model, folder)
    if source == "quantized-int8":
        for weight in llm.engine.runner._quantized_weights():
            weight.int8_activations = True
    return llm


# a split of the quantized products' columns among three threads far from the equal one
SKEWED = (0.0, 0.05, 0.9, 1.0)


@pytest.mark.parametrize(("source", "dtype", "split", "kv"), [
    pytest.param("float", "float32", None, "auto", marks=needs_stack),
    pytest.param("float", "bfloat16", None, "auto", marks=needs_bfloat16_stack),
    pytest.param("quantized", "float32", None, "auto", marks=needs_kernels),
    pytest.param("quantized", "float32", SKEWED, "auto", marks=needs_kernels),
    pytest.param("quantized", "bfloat16", None, "auto", marks=needs_kernels),
    pytest.param("quantized-int8", "float32", SKEWED, "auto", marks=needs_kernels),
    pytest.param("quantized", "float32", None, "int8", marks=needs_kernels),
    pytest.param("quantized", "bfloat16", None, "int8", marks=needs_kernels),
])
def test_stack_gives_the_layers_result_bit_for_bit(tiny_model_dir, monkeypatch, request,
                                                   source, dtype, split, kv):
    """Every step runs both ways: decode steps (one to six rows, one with a short prompt
    chunk beside them) through the stack must equal the layers exactly, K/V writes
    included; steps with a long prompt chunk are left to the layers. On packed float
    weights, and on quantized ones whose fused products mix formats (multiplied exactly,
    or with 8-bit activations). With a split: three threads, the quantized products'
    columns split unequally among them at first, then as the decoder finds their speeds
    after every step; the split must stay one that gives every thread work. With int8 KV
    caches, the stack stores and reads them as the layers do."""
    llm = _engine(source, dtype, tiny_model_dir, kv)
    model = llm.engine.runner.model
    if split is not None:
        request.addfinalizer(lambda threads=torch.get_num_threads():
                             torch.set_num_threads(threads))
        torch.set_num_threads(len(split) - 1)
    stack = model.decoder_stack()
    assert stack is not None
    if split is not None:
        stack.bounds = (ctypes.c_float * len(split))(*split)
    taken, left = [], []

    def both(input_ids, positions, meta):
        x = model.embed_tokens(input_ids)
        rope = model.rotary.lookup(positions, x.dtype)
        caches = [(layer.self_attn.k_cache.clone(), layer.self_attn.v_cache.clone())
                  for layer in model.layers]
        stacked = stack(x.clone(), [rope], [(meta.slot_mapping, meta.block_tables,
                                             meta.context_lens, meta.query_start_loc, None)])
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
    assert any(1 < longest < cpu_attention.PREFILL_MIN_QUERY_LEN for _, longest in taken)
    assert left and min(left) >= cpu_attention.PREFILL_MIN_QUERY_LEN
    if split is not None:
        bounds = list(stack.bounds)
        assert len(bounds) == len(split) and bounds[0] == 0.0 and bounds[-1] == 1.0
        assert bounds != list(split)  # moved by the threads' times
        shares = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
        assert min(shares) >= 0.4 / len(shares), bounds


@needs_stack
def test_stack_leaves_large_steps_and_other_dtypes_to_the_layers(tiny_model_dir):
    """More rows than the blocked product takes go to the layers, and so does a type with no
    C kernels (float16)."""
    llm = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16)
    model = llm.engine.runner.model
    rows = BLOCKED_ROWS.stop
    x = torch.zeros(rows, model.config.hidden_size)
    cos = sin = torch.zeros(rows, model.config.head_dim)
    ids = torch.arange(rows, dtype=torch.int32)
    assert model.decoder_stack()(x, [(cos, sin)], [(
        ids, ids[:, None], ids + 1, torch.arange(rows + 1, dtype=torch.int32))]) is None
    half = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16, dtype="float16")
    assert half.engine.runner.model.decoder_stack() is None
    assert half.generate([[5, 6, 7]], SamplingParams(max_tokens=3))[0].outputs[0].token_ids


@needs_kernels
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quantized_stack_takes_steps_past_the_blocked_rows(tiny_model_dir, dtype):
    """Every product quantized, the stack takes steps of more rows than the packed product
    does (the per-layer path takes the same quantized product at any row count) and still
    equals the layers bit for bit; past QUANTIZED_ROWS it leaves them to the layers."""
    llm = _engine("quantized", dtype, tiny_model_dir)
    model = llm.engine.runner.model
    stack = model.decoder_stack()
    rows = BLOCKED_ROWS.stop + 3
    torch.manual_seed(0)
    x = torch.randn(rows, model.config.hidden_size).to(stack.dtype)
    rope = model.rotary.lookup(torch.arange(rows) % 7, x.dtype)
    slots = torch.arange(rows, dtype=torch.int64) * 16  # block i's first slot (size 16)
    tables = torch.arange(rows, dtype=torch.int32)[:, None]
    context = torch.ones(rows, dtype=torch.int32)
    starts = torch.arange(rows + 1, dtype=torch.int32)
    stacked = stack(x.clone(), [rope], [(slots, tables, context, starts, None)])
    assert stacked is not None
    stacked_caches = [layer.self_attn.k_cache.clone() for layer in model.layers]
    for layer in model.layers:
        layer.self_attn.k_cache.zero_()
        layer.self_attn.v_cache.zero_()
    meta = AttentionMetadata(slots, tables, context, starts, max_query_len=1,
                             max_context_len=1)
    residual = None
    layered = x.clone()
    for layer in model.layers:
        layered, residual = layer(layered, residual, rope, meta)
    assert torch.equal(stacked[0], layered) and torch.equal(stacked[1], residual)
    assert all(torch.equal(a, layer.self_attn.k_cache)
               for a, layer in zip(stacked_caches, model.layers, strict=True))
    many = QUANTIZED_ROWS.stop
    assert stack(torch.zeros(many, model.config.hidden_size).to(stack.dtype),
                 [model.rotary.lookup(torch.zeros(many, dtype=torch.int64), stack.dtype)],
                 [(torch.arange(many), torch.arange(many, dtype=torch.int32)[:, None],
                   torch.ones(many, dtype=torch.int32),
                   torch.arange(many + 1, dtype=torch.int32))]) is None


@needs_kernels
def test_a_quantization_the_kernel_does_not_know_is_named(tiny_model_dir):
    """A product failing inside the stack raises what the layer's own product raises."""
    llm = _engine("quantized", "float32", tiny_model_dir)
    model = llm.engine.runner.model
    o_proj = model.layers[0].self_attn.o_proj
    data = o_proj.quantized.segments[0].data
    o_proj.quantized = QuantizedWeight([Segment(QFormat("unknown", 99, 32, 20), data)],
                                       o_proj.quantized.in_features)
    stack = model.decoder_stack()
    x = torch.zeros(1, model.config.hidden_size)
    cos = sin = torch.zeros(1, model.config.head_dim)
    one = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="linear: a quantization the kernel does not know"):
        stack(x, [(cos, sin)], [(one - 1, one[:, None] - 1, one,
                                 torch.tensor([0, 1], dtype=torch.int32), None)])
    with pytest.raises(ValueError, match="linear: a quantization the kernel does not know"):
        o_proj(torch.zeros(1, o_proj.quantized.in_features))
