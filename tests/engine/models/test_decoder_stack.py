"""The CPU backend's one-call decoder stack against the model's layers called one by one,
on packed float weights and on weights kept quantized."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.bench.synthetic_gguf import SHAPES, write_gguf
from pagedchat.engine.loading.loader import default_model_path
from pagedchat.kernels import cpu
from pagedchat.kernels.quant import QFormat, QuantizedWeight, Segment, dequantize

needs_stack = pytest.mark.skipif(
    not (cpu.kernel_library() is not None and cpu._onednn()),
    reason="the stack needs the AVX-512 C kernels and torch's oneDNN")
needs_kernels = pytest.mark.skipif(cpu.kernel_library() is None,
                                   reason="the stack needs the C kernels")


@pytest.fixture(scope="module")
def quantized_gguf(tmp_path_factory) -> Path:
    """The tiny Llama shape in Q4_1 (the default model's format), drawn wide so that greedy
    steps are not near-ties."""
    path = tmp_path_factory.mktemp("stack-gguf") / "tiny.gguf"
    write_gguf(path, SHAPES["tiny"], default_model_path(), "Q4_1", seed=5, std=0.5)
    return path


def _requantize(weight: QuantizedWeight, parts: list[tuple[int, str]]) -> QuantizedWeight:
    """``weight`` again, its rows cut into runs of the given lengths and formats (a fused
    projection whose parts llama.cpp quantized differently)."""
    values, first, pieces = dequantize(weight).numpy(), 0, []
    for rows, name in parts:
        blocks = gguf.quants.quantize(values[first:first + rows],
                                      gguf.GGMLQuantizationType[name])
        pieces.append(QuantizedWeight.from_blocks(name, torch.from_numpy(blocks),
                                                  weight.in_features))
        first += rows
    return QuantizedWeight.stack(pieces)


def _mix_formats(model) -> None:
    """Layer 0's fused products in several formats, one segment each: q/k/v in three, gate
    and up in two; the other products and layers stay in the file's one format."""
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    attn.qkv_proj.quantized = _requantize(
        attn.qkv_proj.quantized, [(attn.q_size, "Q4_0"), (attn.kv_size, "Q8_0"),
                                  (attn.kv_size, "Q5_0")])
    mlp.gate_up_proj.quantized = _requantize(
        mlp.gate_up_proj.quantized, [(mlp.intermediate, "Q8_0"), (mlp.intermediate, "Q4_1")])
    assert [s.format.name for s in attn.qkv_proj.quantized.segments] == \
        ["Q4_0", "Q8_0", "Q5_0"]


def _engine(source: str, dtype: str, tiny_model_dir: Path, quantized_gguf: Path) -> LLM:
    options = dict(num_kv_blocks=128, block_size=16, max_num_batched_tokens=64, dtype=dtype)
    if source == "float":
        return LLM(model=str(tiny_model_dir), **options)
    llm = LLM(model=str(quantized_gguf), weights="gguf", **options)
    model = llm.engine.runner.model
    assert model.quantized
    _mix_formats(model)
    return llm


@pytest.mark.parametrize(("source", "dtype"), [
    pytest.param("float", "float32", marks=needs_stack),
    pytest.param("float", "bfloat16", marks=needs_stack),
    pytest.param("gguf", "float32", marks=needs_kernels),
    pytest.param("gguf", "bfloat16", marks=needs_kernels),
])
def test_stack_gives_the_layers_result_bit_for_bit(tiny_model_dir, quantized_gguf,
                                                   monkeypatch, source, dtype):
    """Every step runs both ways: decode steps (one to six rows, one with a short prompt
    chunk beside them) through the stack must equal the layers exactly, K/V writes
    included; steps with a long prompt chunk are left to the layers. On packed float
    weights, and on quantized ones whose fused products mix formats."""
    llm = _engine(source, dtype, tiny_model_dir, quantized_gguf)
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


@needs_kernels
def test_a_quantization_the_kernel_does_not_know_is_named(quantized_gguf):
    """A product failing inside the stack raises what the layer's own product raises."""
    llm = LLM(model=str(quantized_gguf), weights="gguf", num_kv_blocks=16, block_size=16)
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
        stack(x, cos, sin, one - 1, one[:, None] - 1, one, torch.tensor([0, 1],
                                                                       dtype=torch.int32))
    with pytest.raises(ValueError, match="linear: a quantization the kernel does not know"):
        o_proj(torch.zeros(1, o_proj.quantized.in_features))
