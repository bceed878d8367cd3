"""A tokenizer read with the ``tokenizers`` library alone, for folders pagedchat writes from a
GGUF (their ``tokenizer.json`` is what transformers saved, so encoding and decoding match);
the chat template renders as transformers' (:mod:`.chat_template`). Offers what pagedchat
calls, with transformers' signatures."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tokenizers import Tokenizer

from pagedchat.engine.loading.chat_template import Message, render_chat

# transformers' named special tokens, the variables a chat template sees
_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
            "mask_token")


def _read_on_a_thread(path: Path) -> Tokenizer:
    """``path`` read by the tokenizers library on a thread of its own, whose glibc arena keeps
    the small buffers the JSON parse frees away from the heap the model's loading reuses."""
    with ThreadPoolExecutor(1, thread_name_prefix="tokenizer-read") as reader:
        return reader.submit(Tokenizer.from_file, str(path)).result()


class TextTokenizer:
    def __init__(self, backend: Tokenizer, special_tokens: dict[str, str],
                 chat_template: str | None) -> None:
        self.backend = backend
        self.special_tokens_map = special_tokens
        self.chat_template = chat_template

    @classmethod
    def from_folder(cls, folder: Path) -> TextTokenizer:
        """``folder``'s tokenizer.json, tokenizer_config.json and chat template (its .jinja or
        the config); OSError or ValueError for a missing or malformed file."""
        backend = _read_on_a_thread(folder / "tokenizer.json")
        backend.no_truncation()
        backend.no_padding()
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        special = {}
        for name in _SPECIAL:
            value = config.get(name)
            if isinstance(value, dict):  # a serialized AddedToken
                value = value.get("content")
            if value is not None:
                special[name] = str(value)
        template_file = folder / "chat_template.jinja"
        template = (template_file.read_text(encoding="utf-8") if template_file.is_file()
                    else config.get("chat_template"))
        if isinstance(template, list):  # named templates: the one used without tools
            template = {entry["name"]: entry["template"] for entry in template}.get("default")
        return cls(backend, special, template)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int] | int, skip_special_tokens: bool = False) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def apply_chat_template(self, conversation: list[Message], add_generation_prompt: bool = False,
                            continue_final_message: bool = False,
                            tokenize: bool = True) -> list[int] | str:
        """The conversation in the chat template: token ids, or the text (``tokenize=False``).
        Raises ValueError where the tokenizer has no template."""
        if not self.chat_template:
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template "
                             "is not set")
        text = render_chat(self.chat_template, conversation, add_generation_prompt,
                           continue_final_message, **self.special_tokens_map)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def _token_id(self, name: str) -> int | None:
        token = self.special_tokens_map.get(name)
        return None if token is None else self.backend.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._token_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._token_id("pad_token")

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)
