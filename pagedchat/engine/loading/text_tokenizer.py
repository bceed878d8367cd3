"""The tokenizer of a folder pagedchat writes from a GGUF, without transformers: its
tokenizer.json (what transformers saved) read by bpe.c where it is a SentencePiece-style BPE
(Gemma's), with the tokenizers library's ids and text in a fraction of its memory, else by that
library; the chat template rendered as transformers' (:mod:`.chat_template`). Offers what
pagedchat calls, with transformers' signatures."""

from __future__ import annotations

import ctypes
import json
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from tokenizers import Tokenizer

from pagedchat.engine.loading.chat_template import Message, render_chat
from pagedchat.kernels.cpu.build import INT, INT64, P, plain_library

_SIGNATURES = {"bpe_load": (P, [ctypes.c_char_p]), "bpe_free": (None, [P]),
               "bpe_encode": (INT64, [P, ctypes.c_char_p, INT64, INT, P]),
               "bpe_decode": (INT64, [P, P, INT64, INT, P, INT64]), "bpe_size": (INT, [P]),
               "bpe_token": (P, [P, INT, P]), "bpe_token_id": (INT, [P, ctypes.c_char_p, INT64])}


class CompactTokenizer:
    """What :class:`TextTokenizer` calls of a ``tokenizers.Tokenizer``, from bpe.c."""

    def __init__(self, library: ctypes.CDLL, handle: int) -> None:
        self._library, self._handle = library, handle
        weakref.finalize(self, library.bpe_free, handle)

    @classmethod
    def load(cls, path: Path) -> CompactTokenizer | None:
        """The tokenizer.json at ``path``; None where bpe.c cannot be built or refuses it."""
        library = plain_library(Path(__file__).with_name("bpe.c"))
        for name, (restype, argtypes) in _SIGNATURES.items() if library else ():
            getattr(library, name).restype, getattr(library, name).argtypes = restype, argtypes
        handle = library.bpe_load(str(path).encode()) if library else None
        return None if handle is None else cls(library, handle)

    def encode(self, text: str, add_special_tokens: bool = True) -> SimpleNamespace:
        data = text.encode()
        out = (ctypes.c_int32 * (len(data) + 1))()
        count = self._library.bpe_encode(self._handle, data, len(data), add_special_tokens, out)
        if count < 0:
            raise MemoryError("the tokenizer ran out of memory")
        return SimpleNamespace(ids=out[:count])

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        array = (ctypes.c_int32 * len(ids))(*ids)
        arguments = (self._handle, array, len(ids), skip_special_tokens)
        out = ctypes.create_string_buffer(self._library.bpe_decode(*arguments, None, 0))
        self._library.bpe_decode(*arguments, out, len(out))
        return out.raw.decode()

    def id_to_token(self, token_id: int) -> str | None:
        length = ctypes.c_int32()
        where = self._library.bpe_token(self._handle, token_id, ctypes.byref(length))
        return None if where is None else ctypes.string_at(where, length.value).decode()

    def token_to_id(self, token: str) -> int | None:
        found = self._library.bpe_token_id(self._handle, token.encode(), len(token.encode()))
        return None if found < 0 else found

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return self._library.bpe_size(self._handle)  # every added token is in the vocabulary


# transformers' named special tokens, the variables a chat template sees
_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
            "mask_token")


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
        path = folder / "tokenizer.json"
        backend = CompactTokenizer.load(path)
        if backend is None:  # on a thread whose glibc arena keeps what the parse frees away
            with ThreadPoolExecutor(1) as reader:  # from the heap the weights' loading reuses
                backend = reader.submit(Tokenizer.from_file, str(path)).result()
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

    # transformers' names for the special tokens' ids (None for a tokenizer without one)
    bos_token_id = property(lambda self: self._token_id("bos_token"))
    eos_token_id = property(lambda self: self._token_id("eos_token"))
    pad_token_id = property(lambda self: self._token_id("pad_token"))

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)
