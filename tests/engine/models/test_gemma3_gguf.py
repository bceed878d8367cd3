"""Gemma 3 on the quantized GGUF path, on a small random Gemma 3 GGUF written here in the
real file's formats: a Q8_0 embedding (the tied head), Q5_0 and Q8_0 projections, Q4_K and
Q6_K where a row is whole blocks of 256, float32 norms stored as ``1 + w``.

Its weights read, value for value, as transformers loads them; greedy tokens on the
quantized path equal the de-quantized path's and transformers ``generate``'s on the file,
with log-probabilities close; the weights resident are the file's tensor bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pagedchat import LLM, SamplingParams
from pagedchat.engine.loading.gguf_weights import read_gguf_weights
from pagedchat.engine.loading.loader import reads_quantized
from pagedchat.kernels.quant import FORMATS, QuantizedWeight, dequantize
from tests.engine.models.test_gemma3 import reference
from tests.gguf_tokenizer import copy_tokenizer

gguf = pytest.importorskip("gguf")

HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE = 64, 4, 256, 256
LAYERS = 6  # transformers' default pattern for a Gemma 3 GGUF: five local layers, one global
WINDOW = 16
# the Triton backend's checks, where a CUDA GPU is
ON_A_GPU = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                         reason="needs a CUDA GPU"))
# where each K format keeps its float16 scales, and their spread (random blocks)
K_SCALES = {"Q4_K": ((0, 2), 0.003), "Q6_K": ((208,), 0.0005)}


def _tensors(layer: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, format) of one layer's tensors; the layers alternate the value
    and down projections' formats, as llama.cpp's Q4_K_M does."""
    q_size = HEADS * HEAD_DIM
    return [(f"blk.{layer}.{name}.weight", shape, kind) for name, shape, kind in (
        ("attn_norm", (HIDDEN,), "F32"),
        ("attn_q", (q_size, HIDDEN), "Q5_0"),
        ("attn_k", (HEAD_DIM, HIDDEN), "Q5_0"),
        ("attn_v", (HEAD_DIM, HIDDEN), "Q8_0" if layer % 2 else "Q5_0"),
        ("attn_q_norm", (HEAD_DIM,), "F32"),
        ("attn_k_norm", (HEAD_DIM,), "F32"),
        ("attn_output", (HIDDEN, q_size), "Q4_K"),
        ("post_attention_norm", (HIDDEN,), "F32"),
        ("ffn_norm", (HIDDEN,), "F32"),
        ("ffn_gate", (INTERMEDIATE, HIDDEN), "Q5_0"),
        ("ffn_up", (INTERMEDIATE, HIDDEN), "Q5_0"),
        ("ffn_down", (HIDDEN, INTERMEDIATE), "Q6_K" if layer % 2 else "Q4_K"),
        ("post_ffw_norm", (HIDDEN,), "F32"),
    )]


def random_tensor(rng: np.random.Generator, shape: tuple[int, ...], kind: str) -> np.ndarray:
    """A norm's stored ``1 + w``; a matrix drawn wide (so greedy steps are not near-ties)
    and quantized by gguf-py; for the K formats, which gguf-py cannot quantize, random
    blocks with finite scales."""
    if kind == "F32":
        return (1.0 + 0.3 * rng.standard_normal(shape)).astype(np.float32)
    if kind not in K_SCALES:
        values = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        return gguf.quants.quantize(values, gguf.GGMLQuantizationType[kind])
    fmt = FORMATS[kind]
    blocks = rng.integers(0, 256, (shape[0] * shape[1] // fmt.block_size, fmt.type_size),
                          dtype=np.uint8)
    offsets, spread = K_SCALES[kind]
    for at in offsets:
        halves = (spread * rng.standard_normal(blocks.shape[0])).astype(np.float16)
        blocks[:, at:at + 2] = halves.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(shape[0], -1)


def write_tiny_gemma3_gguf(target: Path, tokenizer_gguf: Path, seed: int = 0) -> Path:
    """A random Gemma 3 GGUF with the tokenizer of ``tokenizer_gguf`` (copied from it)."""
    writer = gguf.GGUFWriter(target, "gemma3")
    vocab = copy_tokenizer(writer, tokenizer_gguf)
    writer.add_context_length(1024)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(1)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_sliding_window(WINDOW)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_vocab_size(vocab)
    tensors = [("token_embd.weight", (vocab, HIDDEN), "Q8_0")]
    tensors += [t for layer in range(LAYERS) for t in _tensors(layer)]
    tensors.append(("output_norm.weight", (HIDDEN,), "F32"))
    rng = np.random.default_rng(seed)
    for name, shape, kind in tensors:
        data = random_tensor(rng, shape, kind)
        if kind == "F32":
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory, small_tokenizer_gguf) -> Path:
    return write_tiny_gemma3_gguf(tmp_path_factory.mktemp("tiny-gemma3-gguf") / "gemma.gguf",
                                  small_tokenizer_gguf)


def _prompts() -> list[list[int]]:
    """Prompts inside, across and far beyond the window."""
    g = torch.Generator().manual_seed(5)
    return [torch.randint(10, 2000, (n,), generator=g).tolist() for n in (3, 15, 17, 40, 75)]


@pytest.fixture(scope="module")
def references(gemma_gguf) -> list[list[int]]:
    """transformers' greedy continuations on the GGUF (which it de-quantizes)."""
    return reference(gemma_gguf.parent, _prompts(), 12, gguf_file=gemma_gguf.name)


def test_weights_read_as_transformers_loads_them(gemma_gguf):
    """Projections and the embedding stay quantized and de-quantize to transformers' values;
    the norms (stored ``1 + w``) read as transformers' ``w``, bit for bit."""
    from transformers import AutoModelForCausalLM

    ours = read_gguf_weights(gemma_gguf, HEADS, 1)
    model = AutoModelForCausalLM.from_pretrained(gemma_gguf.parent, gguf_file=gemma_gguf.name,
                                                 dtype=torch.float32)
    theirs = model.state_dict()
    theirs.pop("lm_head.weight")  # tied to the embedding
    assert set(ours) == set(theirs)
    for name, weight in ours.items():
        quantized = name.endswith("proj.weight") or name == "model.embed_tokens.weight"
        assert isinstance(weight, QuantizedWeight) == quantized, name
        value = dequantize(weight) if quantized else weight
        assert torch.equal(value, theirs[name]), name
    assert ours["model.layers.0.self_attn.o_proj.weight"].segments[0].format.name == "Q4_K"
    assert ours["model.layers.1.mlp.down_proj.weight"].segments[0].format.name == "Q6_K"


@pytest.mark.parametrize("options", [
    dict(block_size=16, num_kv_blocks=64),
    dict(block_size=1, num_kv_blocks=1024),
    # preempts and chunks: the longest request fits, as its six groups count it, barely
    dict(block_size=4, num_kv_blocks=80, max_num_batched_tokens=24),
    dict(block_size=16, num_kv_blocks=64, attention_backend="torch"),
])
def test_greedy_matches_transformers_on_the_quantized_path(gemma_gguf, references, options):
    assert reads_quantized(gemma_gguf)
    llm = LLM(model=str(gemma_gguf), **options)  # the quantized path is the default
    model = llm.engine.runner.model
    assert llm.engine.config.weights == "gguf" and model.embed_tokens.quantized is not None
    fused = model.layers[0].self_attn.qkv_proj.quantized
    assert [s.format.name for s in fused.segments] == ["Q5_0", "Q5_0", "Q5_0"]
    fused = model.layers[1].self_attn.qkv_proj.quantized
    assert [s.format.name for s in fused.segments] == ["Q5_0", "Q5_0", "Q8_0"]
    outputs = llm.generate(_prompts(), SamplingParams(temperature=0, max_tokens=12))
    assert [o.outputs[0].token_ids for o in outputs] == references
    if options["num_kv_blocks"] == 80:
        assert llm.engine.stats().preemptions > 0


@pytest.mark.parametrize("device", [ON_A_GPU])
@pytest.mark.parametrize("options", [
    dict(block_size=16, num_kv_blocks=64),
    dict(block_size=4, num_kv_blocks=80, max_num_batched_tokens=24),
], ids=["batched", "preempted"])
def test_greedy_matches_transformers_on_a_gpu(gemma_gguf, references, device, options):
    """The Triton backend's windows and groups on the de-quantized weights, float32."""
    llm = LLM(model=str(gemma_gguf), device=device, **options)
    assert llm.engine.config.weights == "float32"
    outputs = llm.generate(_prompts(), SamplingParams(temperature=0, max_tokens=12))
    assert [o.outputs[0].token_ids for o in outputs] == references
    if options["num_kv_blocks"] == 80:
        assert llm.engine.stats().preemptions > 0


def test_quantized_and_de_quantized_paths_agree(gemma_gguf, references):
    """The same greedy tokens and, as the products differ only in the order of their sums,
    log-probabilities within rounding; the quantized path holds the file's tensor bytes."""
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=0)
    runs = {}
    for weights in ("gguf", "float32"):
        llm = LLM(model=str(gemma_gguf), weights=weights, num_kv_blocks=64)
        runs[weights] = ([o.outputs[0] for o in llm.generate(_prompts(), params)],
                         llm.engine.runner.weight_bytes)
    (quantized, quantized_bytes), (plain, plain_bytes) = runs["gguf"], runs["float32"]
    assert [o.token_ids for o in quantized] == [o.token_ids for o in plain] == references
    for q, p in zip(quantized, plain, strict=True):
        chosen = [[lp[token].logprob for lp, token in zip(o.logprobs, o.token_ids, strict=True)]
                  for o in (q, p)]
        assert chosen[0] == pytest.approx(chosen[1], abs=1e-3)
    file_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(gemma_gguf).tensors)
    assert quantized_bytes == file_bytes
    assert plain_bytes > 3 * file_bytes


def test_prefix_cache_hits_keep_the_tokens(gemma_gguf, references):
    """The same prompts again read their prefixes from the cache, to the same tokens."""
    llm = LLM(model=str(gemma_gguf), block_size=16, num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=12)
    llm.generate(_prompts(), params, use_progress=False)
    again = llm.generate(_prompts(), params, use_progress=False)
    assert sum(o.num_cached_tokens for o in again) > 0
    assert [o.outputs[0].token_ids for o in again] == references
