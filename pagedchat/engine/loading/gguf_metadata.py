"""transformers' parses of a GGUF's header (its legacy ``load_gguf_checkpoint`` over gguf-py's
reader, which decodes each array value one at a time, and its own ``read_gguf_metadata``, which
walks each string in Python for every caller) fed by one bulk parse of this package's
(:func:`.read_gguf_header`), its values passing through transformers' decoding as they are.
Tensors come as gguf-py gives them: the file's bytes mapped read-only, same dtype and shape."""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pagedchat.engine.loading.gguf_file import GGUFFile, TensorInfo

# gguf-py's element types of the unquantized formats; every other tensor is its raw bytes
_PLAIN = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8,
          "I16": np.int16, "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class _Field:
    """What transformers reads of a ``ReaderField``: each value by index, decoded."""

    parts: list
    types: tuple[int, ...] = ()

    @property
    def data(self) -> range:
        return range(len(self.parts))


@dataclass(frozen=True)
class _Tensor:
    """What transformers reads of a ``ReaderTensor``: its name, type and data."""

    path: Path
    info: TensorInfo

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def tensor_type(self):
        import gguf

        return gguf.GGMLQuantizationType[self.info.type_name]

    @property
    def data(self) -> np.ndarray:
        plain = _PLAIN.get(self.info.type_name)
        dtype, shape = ((plain, tuple(reversed(self.info.shape))) if plain is not None
                        else (np.uint8, self.info.byte_shape))
        return np.memmap(self.path, dtype=dtype, mode="r", offset=self.info.offset, shape=shape)


class _Reader:
    """Stands for ``gguf.GGUFReader(path)`` in transformers' parse."""

    def __init__(self, header: GGUFFile) -> None:
        arrays = header.array_values or {}
        self.fields: dict[str, _Field] = {  # the reader's own fields come first
            "GGUF.version": _Field([header.version]),
            "GGUF.tensor_count": _Field([len(header.tensors)]),
            "GGUF.kv_count": _Field([len(header.fields) + len(arrays)]),
            **{key: _Field([value]) for key, value in header.fields.items()}}
        for key, values in arrays.items():
            self.fields[key] = _Field(values)
        self.tensors = tuple(_Tensor(header.path, info) for info in header.tensors)


def parse_metadata(parse: Callable[..., dict], header: GGUFFile, **kwargs) -> dict:
    """``parse(path, **kwargs)`` (``load_gguf_checkpoint``: the metadata unless
    ``return_tensors=True``) over this package's parse of its header, with its arrays; a file
    with a nested array goes to gguf-py's reader."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    kwargs.setdefault("return_tensors", False)
    if read_metadata(header) is None:
        return parse(header.path, **kwargs)
    reader = _Reader(header)
    saved = gguf.GGUFReader, gguf_utils._gguf_parse_value
    # the reader stands for gguf-py's, its values already decoded as transformers decodes them
    gguf.GGUFReader = lambda *args, **_: reader
    gguf_utils._gguf_parse_value = lambda value, data_type=None: value
    try:
        return parse(header.path, **kwargs)
    finally:
        gguf.GGUFReader, gguf_utils._gguf_parse_value = saved


def read_metadata(header: GGUFFile, string_arrays: Container[str] = ()) -> tuple | None:
    """transformers' ``read_gguf_metadata`` from ``header`` (parsed with its arrays): every key's
    value, a string array not in ``string_arrays`` as its length; the tensors' names. None where
    an array holds arrays (no supported model's), which transformers' readers each treat apart."""
    metadata: dict = dict(header.fields)
    for key, values in (header.array_values or {}).items():
        if values and isinstance(values[0], list):
            return None
        counted = key not in string_arrays and bool(values) and isinstance(values[0], str)
        metadata[key] = len(values) if counted else list(values)
    return metadata, tuple(tensor.name for tensor in header.tensors)
