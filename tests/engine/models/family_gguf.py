"""Small random GGUFs of the Llama-family architectures, laid out as llama.cpp's converter
and quantizer write them: its tensor names and metadata keys, Q8_0, Q5_0 and Q4_0 matrices
where a row is 64 weights, Q4_K and Q6_K where it is whole blocks of 256, F32 norms and
biases, a Llama 3 file's ``rope_freqs``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests.engine.models.test_gemma3_gguf import random_tensor
from tests.gguf_tokenizer import copy_tokenizer

HIDDEN, INTERMEDIATE, LAYERS = 64, 256, 2


@dataclass(frozen=True)
class Family:
    """One architecture's file: how its layers differ from Llama's."""

    architecture: str  # general.architecture
    name: str  # general.name
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    tied: bool = False  # no output.weight: the head reads the embedding
    qkv_bias: bool = False  # Qwen2's biases on q, k and v
    qk_norm: bool = False  # Qwen3's RMSNorm over each head of q and k
    fused: bool = False  # Phi-3's attn_qkv, and ffn_up holding gate then up
    rope_theta: float = 10000.0
    llama3_rope: dict = field(default_factory=dict)  # a Llama 3 config's rope_scaling

    @property
    def q_rows(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_rows(self) -> int:
        return self.kv_heads * self.head_dim


def rope_factors(family: Family) -> np.ndarray:
    """The ``rope_freqs`` llama.cpp's converter computes from a Llama 3 rope_scaling: the
    divisor of each inverse frequency."""
    scaling = family.llama3_rope
    dim = family.head_dim
    freqs = 1.0 / family.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelength = 2 * math.pi / freq
        if wavelength < old_context / high:
            factors.append(1.0)
        elif wavelength > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _layer_tensors(family: Family, layer: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, format) of one layer's tensors; the layers alternate formats as
    llama.cpp's Q4_K_M mixes them."""
    k_wide = family.q_rows % 256 == 0
    parts = [("attn_norm", (HIDDEN,), "F32")]
    if family.fused:
        parts.append(("attn_qkv", (family.q_rows + 2 * family.kv_rows, HIDDEN), "Q8_0"))
    else:
        parts += [("attn_q", (family.q_rows, HIDDEN), "Q5_0"),
                  ("attn_k", (family.kv_rows, HIDDEN), "Q8_0"),
                  ("attn_v", (family.kv_rows, HIDDEN), "Q8_0" if layer % 2 else "Q4_0")]
    if family.qkv_bias:
        parts += [("attn_q", (family.q_rows,), "bias"), ("attn_k", (family.kv_rows,), "bias"),
                  ("attn_v", (family.kv_rows,), "bias")]
    if family.qk_norm:
        parts += [("attn_q_norm", (family.head_dim,), "F32"),
                  ("attn_k_norm", (family.head_dim,), "F32")]
    parts += [("attn_output", (HIDDEN, family.q_rows), "Q4_K" if k_wide else "Q5_0"),
              ("ffn_norm", (HIDDEN,), "F32")]
    if family.fused:
        parts.append(("ffn_up", (2 * INTERMEDIATE, HIDDEN), "Q5_0"))
    else:
        parts += [("ffn_gate", (INTERMEDIATE, HIDDEN), "Q5_0"),
                  ("ffn_up", (INTERMEDIATE, HIDDEN), "Q8_0")]
    parts.append(("ffn_down", (HIDDEN, INTERMEDIATE), "Q6_K" if layer % 2 else "Q4_K"))
    return [(f"blk.{layer}.{name}.{'bias' if kind == 'bias' else 'weight'}", shape, kind)
            for name, shape, kind in parts]


def _add_config(writer, family: Family, vocab: int) -> None:
    """The metadata llama.cpp's converter writes for the architecture."""
    writer.add_name(family.name)
    writer.add_context_length(1024)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(family.heads)
    writer.add_head_count_kv(family.kv_heads)
    writer.add_rope_freq_base(family.rope_theta)
    writer.add_rope_dimension_count(family.head_dim)
    if family.head_dim != HIDDEN // family.heads:
        writer.add_key_length(family.head_dim)
        writer.add_value_length(family.head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)


def write_family_gguf(target: Path, tokenizer_gguf: Path, family: Family,
                      seed: int = 0) -> Path:
    """A random GGUF of ``family`` with the tokenizer of ``tokenizer_gguf``."""
    import gguf

    writer = gguf.GGUFWriter(target, family.architecture)
    vocab = copy_tokenizer(writer, tokenizer_gguf)
    _add_config(writer, family, vocab)
    tensors = [("token_embd.weight", (vocab, HIDDEN), "Q8_0")]
    tensors += [t for layer in range(LAYERS) for t in _layer_tensors(family, layer)]
    tensors.append(("output_norm.weight", (HIDDEN,), "F32"))
    if not family.tied:
        tensors.append(("output.weight", (vocab, HIDDEN), "Q8_0"))
    rng = np.random.default_rng(seed)
    if family.llama3_rope:
        writer.add_tensor("rope_freqs.weight", rope_factors(family))
    for name, shape, kind in tensors:
        if kind == "bias":
            writer.add_tensor(name, (0.5 * rng.standard_normal(shape)).astype(np.float32))
        elif kind == "F32":
            writer.add_tensor(name, random_tensor(rng, shape, kind))
        else:
            writer.add_tensor(name, random_tensor(rng, shape, kind),
                              raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
