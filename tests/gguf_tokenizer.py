"""An HF folder's byte-level BPE tokenizer written as GGUF metadata, as llama.cpp's
converter stores a ``gpt2`` tokenizer; and a GGUF that holds only such a tokenizer, for the
writers of small test GGUFs to copy (the real model's vocabulary is slow to parse)."""

from __future__ import annotations

import json
from pathlib import Path


def add_tokenizer(writer, folder: Path) -> None:
    """The folder's ``tokenizer.json`` as llama.cpp's ``gpt2`` tokenizer metadata."""
    import gguf
    from transformers import AutoTokenizer

    layout = json.loads((folder / "tokenizer.json").read_text())
    vocab = layout["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    special = {t["content"] for t in layout["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in layout["model"]["merges"]]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL
                            for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def write_tokenizer_gguf(folder: Path, target: Path) -> Path:
    """A GGUF with no tensors whose metadata is the folder's tokenizer."""
    import gguf

    writer = gguf.GGUFWriter(target, "llama")
    add_tokenizer(writer, folder)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def copy_tokenizer(writer, tokenizer_gguf: Path) -> int:
    """Add every ``tokenizer.*`` key of ``tokenizer_gguf`` to ``writer``; the vocabulary's size."""
    import gguf

    source = gguf.GGUFReader(tokenizer_gguf)
    for key, field in source.fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type)
    return len(source.fields["tokenizer.ggml.tokens"].data)
