"""Resolve a model (default, a named model, Hugging Face folder, GGUF file) to a plain HF folder.
A GGUF is de-quantized once into a cache folder keyed by its identity (path, size, mtime);
with ``weights="gguf"`` that folder holds only config and tokenizer, the quantized tensors
read from the file at every start (:mod:`.gguf_weights`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pagedchat import progress
from pagedchat.engine.config import QUANTIZED_WEIGHTS
from pagedchat.engine.errors import ModelLoadError
from pagedchat.engine.loading import gguf_weights
from pagedchat.engine.loading.gguf_file import GGUFFile, read_gguf_header
from pagedchat.engine.loading.named_models import NAMED_MODELS, default_model_path, named_model_path
from pagedchat.kernels.quant import QuantizedWeight, quantize_q8_0
from pagedchat.paths import cache_root

if TYPE_CHECKING:
    import torch

    from pagedchat.engine.model_config import ModelConfig

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text")
_GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3")
_CACHE_FORMAT = "3"
SOURCE_RECORD = "source.json"  # in a conversion's folder: the GGUF it came from


@dataclass
class ModelFiles:
    """An HF folder the engine and transformers can both load; with ``gguf`` set, a folder
    of config and tokenizer only, the weights in that (quantized) file."""

    folder: Path
    source: str
    from_cache: bool
    seconds: float
    gguf: Path | None = None


def reads_quantized(spec: str | os.PathLike | None) -> bool:
    """Whether ``spec`` names a GGUF file whose tensors the quantized path reads as they
    are (the default model and the named models are): a file of a supported architecture."""
    if spec is None:
        return True
    path = Path(spec).expanduser()
    if str(spec) in NAMED_MODELS and not path.exists():
        path = named_model_path(str(spec))
    try:
        return path.is_file() and check_gguf(path) is not None
    except ModelLoadError:  # not a GGUF, or not of a supported architecture
        return False


def prepare_model(spec: str | os.PathLike | None = None, weights: str = "float32") -> ModelFiles:
    """Check ``spec`` (a path, a ``NAMED_MODELS`` name, None: the default) and return its HF
    folder (a GGUF converted once); quantized ``weights``: a folder without weights."""
    start = time.perf_counter()
    if spec is None:
        path = default_model_path()
    elif str(spec) in NAMED_MODELS and not Path(spec).exists():
        path = named_model_path(str(spec))
    else:
        path = Path(spec).expanduser()
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or folder")
    if path.is_dir():
        if weights in QUANTIZED_WEIGHTS:
            raise ModelLoadError(f"{path}: --weights {weights} reads a GGUF file, this is a "
                                 "folder (use --weights float32 or bfloat16)")
        check_hf_folder(path)
        return ModelFiles(path, str(path), False, time.perf_counter() - start)
    if weights in QUANTIZED_WEIGHTS:
        folder = cache_root() / "models" / f"{_gguf_key(path)}-metadata"
        from_cache = (folder / "config.json").is_file()
        if not from_cache:  # the file's products compile while its tokenizer is converted
            gguf_weights.prepare_products(check_gguf(path))
            with progress.task(f"reading {path.name}'s config and tokenizer, once"):
                _write_folder(folder, path,
                              lambda staging: gguf_weights.write_metadata(path, staging))
        return ModelFiles(folder, str(path), from_cache, time.perf_counter() - start, path)
    if weights == "q8_0":
        raise ModelLoadError(f"{path}: --weights q8_0 quantizes an HF folder at load; a GGUF "
                             "keeps its own blocks (--weights gguf)")
    folder = cache_root() / "models" / _gguf_key(path)
    from_cache = (folder / "model.safetensors").is_file()
    if not from_cache:
        check_gguf(path)
        with progress.task(f"converting {path.name} to float32 weights, once"):
            _convert_gguf(path, folder)
    return ModelFiles(folder, str(path), from_cache, time.perf_counter() - start)


def check_hf_folder(folder: Path) -> None:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{folder}: not a model folder (no config.json)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"{config_path}: unreadable config ({error})") from error
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(f"{folder}: unsupported architecture {model_type!r} "
                             f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    if not list(folder.glob("*.safetensors")):
        raise ModelLoadError(f"{folder}: no .safetensors weights in the folder")


def check_gguf(path: Path) -> GGUFFile:
    """``path``'s header; a file not a GGUF, cut short or of an unsupported model is rejected."""
    header = read_gguf_header(path)
    if (arch := header.fields.get("general.architecture")) not in _GGUF_ARCHITECTURES:
        raise ModelLoadError(f"{path}: unsupported architecture {arch!r} "
                             f"(supported: {', '.join(_GGUF_ARCHITECTURES)})")
    return header


def load_weights(config: ModelConfig) -> dict[str, gguf_weights.Weight]:
    """The model's weights under transformers' names: read quantized from its GGUF where it was
    prepared with ``weights="gguf"`` (flagged for 8-bit activations where the config asks for them),
    else from its folder (its matrices quantized to Q8_0 where the config asks for it)."""
    if config.gguf is not None:
        weights = gguf_weights.read_gguf_weights(config.gguf, config.num_attention_heads,
                                                 config.num_key_value_heads)
        for weight in weights.values():
            if isinstance(weight, QuantizedWeight):
                weight.int8_activations = config.int8_activations
        return weights
    weights = read_weights(config.folder)
    if config.quantize_q8_0:
        # every matrix whose rows are whole blocks: the products' and the embedding's
        weights = {name: quantize_q8_0(tensor)
                   if tensor.dim() == 2 and tensor.is_floating_point() and tensor.shape[1] % 32 == 0
                   else tensor
                   for name, tensor in weights.items()}
    return weights


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files (those its index names, if it has one)."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / name for name in names]
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            tensors.update(load_file(path))
        except Exception as error:
            raise ModelLoadError(f"{path}: cannot read weights ({error})") from error
    return tensors


def _identity(path: Path) -> dict[str, object]:
    """What names a GGUF's version: where it is, its size and when it last changed."""
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _gguf_key(path: Path) -> str:
    text = "|".join(str(value) for value in (*_identity(path).values(), _CACHE_FORMAT))
    return f"{path.stem}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _convert_gguf(path: Path, folder: Path) -> None:
    """De-quantize with transformers (its parse fed by this package's header reader: see
    gguf_weights.header_parsed_once) and write config, tokenizer and safetensors."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        with gguf_weights.header_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                         dtype=torch.float32)
    except Exception as error:
        raise ModelLoadError(f"{path}: transformers could not read the GGUF ({error})") from error
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = {name: tensor.contiguous() for name, tensor in state.items()}
    # The weights are plain floats now: without this, transformers would treat the folder
    # as a packed GGUF checkpoint and run its de-quantizing kernels on every matmul.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    gguf_weights.add_rope_freqs(model.config, path)
    def write(staging: Path) -> None:
        model.config.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        save_file(state, staging / "model.safetensors", metadata={"source": str(path)})

    _write_folder(folder, path, write)


def _write_folder(folder: Path, source: Path, write: Callable[[Path], None]) -> None:
    """``write`` into a staging folder that then takes ``folder``'s place (a start cut short
    leaves none half written), recording ``source``'s identity; stale conversions go.

    ``folder`` is named by the source's identity, so one holding every file written here is
    the same conversion, done meanwhile by another start (two commands started at once):
    that one stays, as its process may be reading it; an incomplete one is replaced."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".converting-"))

    def done_elsewhere() -> bool:
        return folder.is_dir() and all((folder / item.name).exists() for item in staging.iterdir())

    try:
        write(staging)
        (staging / SOURCE_RECORD).write_text(json.dumps(_identity(source)))
        if not done_elsewhere():
            shutil.rmtree(folder, ignore_errors=True)
            try:
                staging.rename(folder)
            except OSError:
                if not done_elsewhere():  # another start's rename came first
                    raise
    except OSError as error:
        raise ModelLoadError(f"{folder}: cannot write the converted model ({error})") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _remove_stale_conversions(folder.parent)


def _remove_stale_conversions(models: Path) -> None:
    """Remove cached conversions whose GGUF is gone or changed; those without a record stay."""
    for record in models.glob(f"*/{SOURCE_RECORD}"):
        try:
            identity = json.loads(record.read_text())
            source = Path(identity["path"])
            stale = not source.is_file() or _identity(source) != identity
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable now (another process writing it): leave it
        if stale:
            shutil.rmtree(record.parent, ignore_errors=True)
