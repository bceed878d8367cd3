"""Opening a model before its weights: its files, shape and tokenizer, and the engine's
config with the weights and the context resolved."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from pagedchat.engine.config import CPU_WEIGHTS, EngineConfig
from pagedchat.engine.errors import ModelLoadError
from pagedchat.engine.loading.loader import ModelFiles, prepare_model, reads_quantized
from pagedchat.engine.loading.tokenizer import load_tokenizer
from pagedchat.engine.model_config import ModelConfig
from pagedchat.engine.parallel.tensor_parallel import check_size
from pagedchat.engine.runner.memory import hand_back_freed_memory
from pagedchat.engine.runner.model_runner import resolve_device
from pagedchat.kernels import select_backend


@dataclass(frozen=True)
class OpenedModel:
    """A model opened without its weights: its files, shape and tokenizer, and the engine's
    config with the weights and the context resolved (see :func:`open_model`)."""

    config: EngineConfig
    files: ModelFiles
    model_config: ModelConfig
    tokenizer: Any


def open_model(config: EngineConfig) -> OpenedModel:
    """Everything the engine reads of a model before its weights, so that a caller can size
    the engine from it (``pagedchat run`` fits the pool to its request) before LLMEngine."""
    # a first start's kernel compile begins here, beside the files' preparation
    select_backend(resolve_device(config.device), config.attention_backend).prepare()
    config = resolve_weights(config)
    files = prepare_model(config.model, config.weights)
    try:
        model_config = replace(ModelConfig.from_folder(files.folder), gguf=files.gguf,
                               int8_activations=config.weights == "gguf-int8",
                               quantize_q8_0=config.weights == "q8_0")
        tokenizer = load_tokenizer(model_config)
    except Exception as error:
        raise ModelLoadError(
            f"{files.folder}: cannot read config or tokenizer ({error})") from error
    # what a first start's conversion and the tokenizer's parse freed goes back before the weights
    # load; only now, as their many mid-sized buffers a low mapping threshold would map one by one
    hand_back_freed_memory()
    context = model_config.max_position_embeddings
    config = replace(config, max_model_len=min(config.max_model_len or context, context))
    check_size(config.tensor_parallel_size, model_config)
    return OpenedModel(config, files, model_config, tokenizer)


def resolve_weights(config: EngineConfig) -> EngineConfig:
    """``config`` with its weights chosen (see ``EngineConfig.weights``) and its dtype
    following de-quantized ones. Quantized weights are multiplied on the CPU only."""
    weights = config.weights
    on_cpu = resolve_device(config.device) == "cpu"
    if weights is None:
        gguf = reads_quantized(config.model) and on_cpu and config.dtype == "float32"
        weights = "gguf" if gguf else config.dtype
    if weights in CPU_WEIGHTS and not on_cpu:
        raise ModelLoadError(f"--weights {weights} runs on the CPU: use --weights float32 or "
                             "bfloat16 on a GPU")
    dtype = config.dtype if weights in CPU_WEIGHTS else weights
    return replace(config, weights=weights, dtype=dtype)


def eos_token_ids(model_config: ModelConfig, tokenizer) -> set[int]:
    """Every id that ends a reply: the end-of-sequence ids of the generation config, of the
    model config and of the tokenizer."""
    ids: set[int] = set()
    try:
        generation = json.loads(
            (model_config.folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        generation = {}
    for value in (generation.get("eos_token_id"), model_config.eos_token_id,
                  tokenizer.eos_token_id):
        ids.update([value] if isinstance(value, int) else value or [])  # an id, or a list
    return ids
