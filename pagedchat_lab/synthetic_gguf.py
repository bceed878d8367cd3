"""A random-weight Llama-family GGUF of a chosen size, written through the ``gguf`` package.

It shows how decode speed scales with the bytes read per token, without downloading a
bigger model. The tokenizer (vocabulary, merges, chat template) is copied from the default
model's GGUF, so every prompt the bench builds works on it; the weights are random, so what
it says is noise, but pagedchat, transformers and llama.cpp all compute the same function of
the same file. Tensors are generated, quantized and written one at a time: memory holds one
tensor, never the model. The file goes to the pagedchat cache folder, keyed by its shape,
quantization and seed, and is written once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pagedchat.paths import cache_root

FORMAT = "1"  # bump when the file this module writes for the same arguments changes


@dataclass(frozen=True)
class Shape:
    """A Llama decoder's sizes; the vocabulary comes from the tokenizer's file."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    context: int = 4096
    rope_theta: float = 100000.0
    rms_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self, vocab: int) -> int:
        """Weights in the file (the head is tied to the embedding, as in SmolLM2)."""
        kv = self.kv_heads * self.head_dim
        layer = (2 * self.hidden * self.hidden + 2 * self.hidden * kv
                 + 3 * self.hidden * self.intermediate + 2 * self.hidden)
        return vocab * self.hidden + self.layers * layer + self.hidden


SHAPES = {
    # about 1.5B weights with SmolLM2's vocabulary: Llama-3.2-1B's width and heads
    "1.5b": Shape(hidden=2048, layers=24, intermediate=8192, heads=32, kv_heads=8),
    # small enough for unit tests (every row a multiple of the 32-weight quant block)
    "tiny": Shape(hidden=64, layers=2, intermediate=128, heads=4, kv_heads=2, context=512),
}


def quant_types() -> list[str]:
    """The GGML types this ``gguf`` package can quantize to (Q8_0, Q4_0...; Q4_K where a
    later release adds it), probed on one block rather than listed by hand."""
    from gguf import GGMLQuantizationType, quants

    found = []
    for name in ("Q8_0", "Q4_K", "Q6_K", "Q5_0", "Q4_1", "Q4_0"):
        qtype = GGMLQuantizationType[name]
        try:
            quants.quantize(np.zeros((1, 256), np.float32), qtype)
        except NotImplementedError:
            continue
        found.append(name)
    return found


def _file_type(quant: str) -> int:
    from gguf import LlamaFileType

    return int(LlamaFileType[f"MOSTLY_{quant}"])


def llama_tensors(shape: Shape, vocab: int) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """(GGUF name, numpy shape, quantized) of every tensor of a llama GGUF with a tied head,
    in the file's order."""
    kv = shape.kv_heads * shape.head_dim
    yield "token_embd.weight", (vocab, shape.hidden), True
    for i in range(shape.layers):
        yield f"blk.{i}.attn_norm.weight", (shape.hidden,), False
        yield f"blk.{i}.attn_q.weight", (shape.heads * shape.head_dim, shape.hidden), True
        yield f"blk.{i}.attn_k.weight", (kv, shape.hidden), True
        yield f"blk.{i}.attn_v.weight", (kv, shape.hidden), True
        yield f"blk.{i}.attn_output.weight", (shape.hidden, shape.heads * shape.head_dim), True
        yield f"blk.{i}.ffn_norm.weight", (shape.hidden,), False
        yield f"blk.{i}.ffn_gate.weight", (shape.intermediate, shape.hidden), True
        yield f"blk.{i}.ffn_up.weight", (shape.intermediate, shape.hidden), True
        yield f"blk.{i}.ffn_down.weight", (shape.hidden, shape.intermediate), True
    yield "output_norm.weight", (shape.hidden,), False


def _values(rng: np.random.Generator, dims: tuple[int, ...], quantized: bool,
            std: float) -> np.ndarray:
    """A matrix ~ N(0, std); a norm's scale ~ 1 + N(0, 0.1), so it is not a no-op."""
    if not quantized:
        return (1.0 + 0.1 * rng.standard_normal(dims, dtype=np.float32)).astype(np.float32)
    return rng.standard_normal(dims, dtype=np.float32) * np.float32(std)


def add_llama_config(writer, shape: Shape, vocab: int) -> None:
    """The decoder's sizes as a llama GGUF's metadata (``writer``: a ``gguf.GGUFWriter``)."""
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_vocab_size(vocab)


def write_gguf(path: Path, shape: Shape, tokenizer_gguf: Path, quant: str = "Q8_0",
               seed: int = 0, std: float = 0.02) -> None:
    """Write a random-weight llama GGUF to ``path`` (through a temporary file beside it)."""
    import gguf

    if quant not in quant_types():
        raise ValueError(f"the gguf package cannot quantize to {quant} (it can: "
                         f"{', '.join(quant_types())})")
    qtype = gguf.GGMLQuantizationType[quant]
    reader = gguf.GGUFReader(tokenizer_gguf)
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    writer = gguf.GGUFWriter(None, "llama")
    writer.add_name(f"pagedchat synthetic llama {shape.parameters(vocab) / 1e9:.2f}B")
    writer.add_file_type(_file_type(quant))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_llama_config(writer, shape, vocab)
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type)
    tensors = list(llama_tensors(shape, vocab))
    for name, dims, quantized in tensors:
        if quantized:
            writer.add_tensor_info(name, gguf.quant_shape_to_byte_shape(dims, qtype), np.uint8,
                                   int(np.prod(gguf.quant_shape_to_byte_shape(dims, qtype))),
                                   raw_dtype=qtype)
        else:
            writer.add_tensor_info(name, dims, np.float32, int(np.prod(dims)) * 4)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        writer.write_header_to_file(partial)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for index, (_, dims, quantized) in enumerate(tensors):
            values = _values(np.random.default_rng([seed, index]), dims, quantized, std)
            writer.write_tensor_data(gguf.quants.quantize(values, qtype) if quantized else values)
        writer.close()
        partial.rename(path)
    finally:
        partial.unlink(missing_ok=True)


def synthetic_path(size: str, quant: str, seed: int) -> Path:
    """Where the cache keeps the model of these arguments."""
    if size not in SHAPES:
        raise ValueError(f"unknown size {size!r} (choose from {', '.join(SHAPES)})")
    return cache_root() / "synthetic" / f"llama-{size}-{quant}-seed{seed}-v{FORMAT}.gguf"


def synthetic_model(size: str = "1.5b", quant: str = "Q8_0", seed: int = 0,
                    tokenizer_gguf: Path | None = None) -> tuple[Path, bool]:
    """The cached random-weight GGUF of ``size`` (a key of SHAPES), written on first use;
    returns its path and whether it was there already."""
    from pagedchat.engine.loading.loader import default_model_path

    path = synthetic_path(size, quant, seed)
    if path.is_file():
        return path, True
    write_gguf(path, SHAPES[size], tokenizer_gguf or default_model_path(), quant, seed)
    return path, False
