"""Model resolution: the default GGUF, HF folders, the conversion cache, and clear errors."""

from __future__ import annotations

import json
import shutil

import pytest

from pagedchat import LLM
from pagedchat.engine.errors import ModelLoadError
from pagedchat.engine.loading.gguf_file import read_gguf_header
from pagedchat.engine.loading.loader import (
    check_gguf,
    default_model_path,
    prepare_model,
    reads_quantized,
)


def test_missing_path_is_named(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match=r"nope\.gguf: no such file"):
        prepare_model(missing)


def test_a_file_that_is_not_a_model(tmp_path):
    bogus = tmp_path / "notes.txt"
    bogus.write_text("hello")
    with pytest.raises(ModelLoadError, match=r"notes\.txt: not a model"):
        prepare_model(bogus)


def test_truncated_gguf(tmp_path):
    source = default_model_path()
    cut = tmp_path / "cut.gguf"
    with source.open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(source.stat().st_size // 2))
    with pytest.raises(ModelLoadError, match=r"cut\.gguf: .*truncated"):
        prepare_model(cut)


def test_gguf_cut_inside_its_header(tmp_path):
    cut = tmp_path / "header.gguf"
    with default_model_path().open("rb") as src:
        cut.write_bytes(src.read(4000))
    with pytest.raises(ModelLoadError, match=r"header\.gguf: .*(corrupt|truncated)"):
        check_gguf(cut)


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        prepare_model(tmp_path)


def test_unsupported_architecture(tmp_path, tiny_model_dir):
    folder = tmp_path / "gpt2ish"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gpt2'"):
        LLM(model=str(folder))


def test_hf_folder_without_weights(tmp_path, tiny_model_dir):
    folder = tmp_path / "noweights"
    shutil.copytree(tiny_model_dir, folder)
    for path in folder.glob("*.safetensors"):
        path.unlink()
    with pytest.raises(ModelLoadError, match="no .safetensors"):
        prepare_model(folder)


@pytest.mark.slow
def test_converted_gguf_is_cached_by_file_identity(real_model_dir):
    again = prepare_model(None)
    assert again.from_cache and again.folder == real_model_dir
    assert (real_model_dir / "model.safetensors").is_file()


def _header_only_gguf(path, arch: str):
    """A GGUF of metadata only: a scalar and a string before the architecture, an array
    after it."""
    import gguf

    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(2)
    writer.add_token_list(["a", "b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "gpt2"])
def test_architecture_read_from_the_header(tmp_path, arch):
    path = _header_only_gguf(tmp_path / "m.gguf", arch)
    assert read_gguf_header(path).fields["general.architecture"] == arch
    assert reads_quantized(path) == (arch != "gpt2")


def test_quantized_weights_refused_for_an_unsupported_architecture(tmp_path):
    path = _header_only_gguf(tmp_path / "gpt2.gguf", "gpt2")
    with pytest.raises(ModelLoadError, match=r"unsupported architecture 'gpt2'"):
        prepare_model(path, weights="gguf")


def test_architecture_of_a_file_that_is_not_gguf(tmp_path):
    bogus = tmp_path / "notes.txt"
    bogus.write_text("hello, not a model")
    assert not reads_quantized(bogus)


def test_a_conversion_goes_once_its_gguf_is_deleted_or_changed(tmp_path, monkeypatch,
                                                                small_vocab_model_dir):
    import os

    from pagedchat.engine.loading.loader import SOURCE_RECORD
    from tests.engine.loading.test_gguf_weights import write_tiny_gguf

    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path / "cache"))
    original = write_tiny_gguf(small_vocab_model_dir, tmp_path / "tiny.gguf", {})
    deleted, changed, kept = (tmp_path / f"{name}.gguf" for name in ("deleted", "changed",
                                                                      "kept"))
    for path in (deleted, changed, kept):
        shutil.copy(original, path)
    folders = {path: prepare_model(path, weights="gguf").folder
               for path in (deleted, changed, kept)}
    record = json.loads((folders[kept] / SOURCE_RECORD).read_text())
    assert record["path"] == str(kept.resolve())
    unrecorded = folders[kept].parent / "written-before-records"
    unrecorded.mkdir()

    deleted.unlink()
    stat = changed.stat()
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    again = prepare_model(changed, weights="gguf")  # a new conversion: the file changed

    assert not again.from_cache and again.folder != folders[changed]
    assert not folders[deleted].exists() and not folders[changed].exists()
    assert folders[kept].is_dir() and unrecorded.is_dir()
    assert prepare_model(kept, weights="gguf").from_cache


def test_a_conversion_another_start_finished_meanwhile_stays(tmp_path):
    """Two first starts at once: the later to finish keeps the folder the earlier one wrote
    (its process may be reading it); a folder missing a file is replaced."""
    from pagedchat.engine.loading.loader import _write_folder

    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF")
    folder = tmp_path / "models" / "model-key"

    def write(staging):
        (staging / "config.json").write_text("{}")

    _write_folder(folder, source, write)
    first = folder.stat().st_ino
    _write_folder(folder, source, write)
    assert folder.stat().st_ino == first
    (folder / "config.json").unlink()
    _write_folder(folder, source, write)
    assert folder.stat().st_ino != first and (folder / "config.json").is_file()
    assert [item.name for item in folder.parent.iterdir()] == ["model-key"]


def test_a_first_start_compiles_the_products_while_it_converts_the_tokenizer(
        tmp_path, monkeypatch, small_vocab_model_dir):
    from pagedchat.engine.loading import gguf_weights
    from pagedchat.kernels.quant import FORMATS, INT8_ACTIVATIONS
    from tests.engine.loading.test_gguf_weights import write_tiny_gguf

    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path / "cache"))
    # a tied head: the Q8_0 embedding, whose 8-bit products the greedy screen takes too
    path = write_tiny_gguf(small_vocab_model_dir, tmp_path / "tiny.gguf",
                           {"token_embd": "Q8_0", "ffn_down": "Q4_0"})
    calls: list[tuple[str, set[int]]] = []
    monkeypatch.setattr(gguf_weights, "prepare", lambda kinds: calls.append(("compile", kinds)))
    write_metadata = gguf_weights.write_metadata
    monkeypatch.setattr(gguf_weights, "write_metadata", lambda path, folder: (
        calls.append(("convert", set())), write_metadata(path, folder)))

    prepare_model(path, weights="gguf")
    prepare_model(path, weights="gguf")  # a later start reads its folder from the cache

    q8_0 = FORMATS["Q8_0"].type_id
    assert calls == [("compile", {FORMATS["Q4_0"].type_id, q8_0, q8_0 | INT8_ACTIVATIONS}),
                     ("convert", set())]
