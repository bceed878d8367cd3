"""Load the model's tokenizer: without transformers for a folder written from a GGUF, else
as ``AutoTokenizer`` would but skipping its config read (heavy imports) where none of its
special cases (remote code, Mistral format, a known-wrong hub class) applies and
``tokenizer_config.json`` names the generic tokenizers-backed class."""

from __future__ import annotations

import json

from pagedchat.engine.loading.loader import SOURCE_RECORD
from pagedchat.engine.loading.text_tokenizer import TextTokenizer
from pagedchat.engine.model_config import ModelConfig

_GENERIC = {"TokenizersBackend", "PreTrainedTokenizerFast"}


def load_tokenizer(model_config: ModelConfig):
    """A :class:`TextTokenizer` for a folder converted from a GGUF, else transformers'
    (raises what the loading raises)."""
    folder = model_config.folder
    if (folder / SOURCE_RECORD).is_file() and (folder / "tokenizer.json").is_file():
        return TextTokenizer.from_folder(folder)
    return load_hf_tokenizer(model_config)


def load_hf_tokenizer(model_config: ModelConfig):
    """The transformers tokenizer of the model folder (for what needs transformers' class:
    xgrammar, the peers; raises what transformers raises)."""
    from transformers.models.auto import tokenization_auto as auto

    folder = model_config.folder
    try:
        declared = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        declared = {}
    model_type = model_config.model_type
    if (declared.get("tokenizer_class") in _GENERIC and "auto_map" not in declared
            and model_type not in auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS
            and auto.TOKENIZER_MAPPING_NAMES.get(model_type) != "MistralCommonBackend"):
        return auto.tokenizer_class_from_name("TokenizersBackend").from_pretrained(folder)
    return auto.AutoTokenizer.from_pretrained(folder)

