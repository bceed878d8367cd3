"""transformers' parse of a GGUF's metadata (``load_gguf_checkpoint`` without tensors),
fed by this package's header reader instead of gguf-py's ``GGUFReader``.

transformers builds a GGUF's config and tokenizer from ``GGUFReader``'s fields, decoding
each value of each array from its own numpy view, one at a time: for a vocabulary of a
quarter million tokens, most of a first start. Here the same fields hold values already
decoded (:func:`.read_gguf_header` reads each array in bulk), and transformers' decoding of
a value hands it back as it is; the rest of its parse (the renaming, the defaults, the
tokenizer's layout) is its own, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pagedchat.engine.loading.gguf_file import TensorInfo, read_gguf_header


@dataclass(frozen=True)
class _Field:
    """What transformers reads of a ``ReaderField``: each value by index, decoded."""

    parts: list
    types: tuple[int, ...] = ()

    @property
    def data(self) -> range:
        return range(len(self.parts))


class _Reader:
    """Stands for ``gguf.GGUFReader(path)`` where transformers reads only metadata."""

    def __init__(self, path: str | Path, mode: str = "r") -> None:
        header = read_gguf_header(Path(path), with_arrays=True)
        arrays = header.array_values or {}
        self.fields: dict[str, _Field] = {  # the reader's own fields come first
            "GGUF.version": _Field([header.version]),
            "GGUF.tensor_count": _Field([len(header.tensors)]),
            "GGUF.kv_count": _Field([len(header.fields) + len(arrays)]),
            **{key: _Field([value]) for key, value in header.fields.items()}}
        for key, values in arrays.items():
            self.fields[key] = _Field(values)
        self.tensors: tuple[TensorInfo, ...] = header.tensors
        self.nested = any(values and isinstance(values[0], list) for values in arrays.values())


def _decoded(value, data_type=None):
    """transformers' ``_gguf_parse_value`` for a value :class:`_Reader` already decoded."""
    return value


def parse_metadata(parse: Callable[..., dict], path: str | Path) -> dict:
    """``parse(path, return_tensors=False)`` (transformers' ``load_gguf_checkpoint``) over
    this package's reader of the header. A file with a nested array (no supported model
    has one) is parsed by gguf-py's reader as before."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    reader = _Reader(path)
    if reader.nested:
        return parse(path, return_tensors=False)
    saved = gguf.GGUFReader, gguf_utils._gguf_parse_value
    gguf.GGUFReader, gguf_utils._gguf_parse_value = (lambda *args, **kwargs: reader), _decoded
    try:
        return parse(path, return_tensors=False)
    finally:
        gguf.GGUFReader, gguf_utils._gguf_parse_value = saved
