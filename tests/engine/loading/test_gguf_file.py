"""The GGUF header reader: the same tensors, at the same places, as gguf-py's GGUFReader,
with the metadata's arrays stepped over (only their lengths kept), and the weights read
without GGUFReader at all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pagedchat.engine.errors import ModelLoadError
from pagedchat.engine.loading.gguf_file import read_gguf_header
from pagedchat.engine.loading.gguf_weights import read_gguf_weights

gguf = pytest.importorskip("gguf")

TOKENS = [f"token-{i}" for i in range(5000)]


def write_gguf(path: Path) -> Path:
    """Scalars, strings, arrays of numbers, strings and arrays, and tensors of several
    types and ranks."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_float32("test.scale", 0.5)
    writer.add_bool("test.flag", True)
    writer.add_token_list(TOKENS)
    writer.add_token_scores([float(i) for i in range(len(TOKENS))])
    writer.add_array("test.nested", [[1, 2], [3, 4, 5]])
    writer.add_chat_template("{{ messages }}")
    rng = np.random.default_rng(0)
    writer.add_tensor("blk.0.ffn_down.weight", rng.standard_normal((3, 64), dtype=np.float32))
    writer.add_tensor("output_norm.weight", rng.standard_normal(64).astype(np.float16))
    blocks = gguf.quants.quantize(rng.standard_normal((4, 256), dtype=np.float32),
                                  gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("token_embd.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_header_matches_gguf_py(tmp_path):
    path = write_gguf(tmp_path / "sample.gguf")
    header = read_gguf_header(path)
    reader = gguf.GGUFReader(path)
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(header.tensors, reader.tensors, strict=True):
        assert ours.type_name == theirs.tensor_type.name
        assert ours.shape == tuple(int(n) for n in theirs.shape)
        assert (ours.offset, ours.n_bytes) == (theirs.data_offset, theirs.n_bytes)
        assert np.array_equal(header.read(ours).reshape(-1),
                              np.asarray(theirs.data).reshape(-1).view(np.uint8))
    assert header.fields["general.architecture"] == "llama"
    assert header.fields["llama.block_count"] == 2
    assert header.fields["test.scale"] == 0.5 and header.fields["test.flag"] is True
    assert header.fields["tokenizer.chat_template"] == "{{ messages }}"


def test_arrays_are_stepped_over(tmp_path):
    """The tokenizer's arrays are stepped over, never read as values; what follows them (the
    tensors) is read as a parse with the arrays reads it."""
    path = write_gguf(tmp_path / "sample.gguf")
    header = read_gguf_header(path)
    assert header.array_values is None
    arrays = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "test.nested"}
    assert not arrays & set(header.fields)
    assert header.tensors and header.tensors == read_gguf_header(path, with_arrays=True).tensors


def test_damaged_files_are_named(tmp_path):
    path = write_gguf(tmp_path / "sample.gguf")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-100])
    with pytest.raises(ModelLoadError, match="cut.gguf: truncated GGUF"):
        read_gguf_header(cut)
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(data[:2000])
    with pytest.raises(ModelLoadError, match="header.gguf: corrupt or truncated GGUF"):
        read_gguf_header(header_only)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGML" + data[4:])
    with pytest.raises(ModelLoadError, match="other.gguf: not a model"):
        read_gguf_header(other)
    with pytest.raises(ModelLoadError, match="missing.gguf: cannot read"):
        read_gguf_header(tmp_path / "missing.gguf")


def test_weights_load_without_gguf_py_reader(tmp_path, monkeypatch):
    """Loading the weights never builds a GGUFReader, the object that materialises every
    string of the tokenizer's arrays."""
    path = write_gguf(tmp_path / "sample.gguf")

    def refuse(*args, **kwargs):
        raise AssertionError("GGUFReader was built while loading the weights")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    monkeypatch.setattr(gguf.gguf_reader, "GGUFReader", refuse)
    weights = read_gguf_weights(path, num_heads=1, num_kv_heads=1)
    assert sorted(weights) == ["model.embed_tokens.weight",
                               "model.layers.0.mlp.down_proj.weight", "model.norm.weight"]
    assert weights["model.embed_tokens.weight"].shape == (4, 256)
    assert weights["model.norm.weight"].shape == (64,)


def test_arrays_read_in_bulk_are_gguf_pys_values(tmp_path):
    path = write_gguf(tmp_path / "sample.gguf")
    header = read_gguf_header(path, with_arrays=True)
    reader = gguf.GGUFReader(path)
    for key, values in header.array_values.items():
        field = reader.fields[key]
        if values and isinstance(values[0], list):  # gguf-py lists a nested array's leaves
            values = [leaf for inner in values for leaf in inner]
        assert values == [field.contents(i) for i in range(len(field.data))], key
    assert set(header.array_values) == {"tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                        "test.nested"}
    assert read_gguf_header(path).array_values is None
