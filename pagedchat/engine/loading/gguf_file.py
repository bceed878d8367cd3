"""A GGUF file's header without its arrays (scalars, strings, where each tensor lies), and
tensors' bytes. gguf-py's ``GGUFReader`` makes an object of every value (a vocabulary: hundreds
of thousands, alive while the weights load); the engine needs none, so an array is stepped
over. Quantized tensors are mapped (``map``): the file's pages are the weights,
never beside a copy; the others are read (``read``) and converted."""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pagedchat.engine.errors import ModelLoadError

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
# metadata value types (GGUF's numbering): the fixed-size ones as struct formats
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
           11: "q", 12: "d"}
STRING, ARRAY = 8, 9

Value = int | float | bool | str


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's header entry: ``shape`` innermost (contiguous) first, ``offset`` in the file."""

    name: str
    type_name: str  # GGML's name for its type: F32, F16, BF16, Q4_1, Q6_K ...
    shape: tuple[int, ...]
    offset: int
    n_bytes: int

    @property
    def byte_shape(self) -> tuple[int, ...]:
        """Outermost dimension first, the innermost counted in bytes (whole blocks)."""
        outer = tuple(reversed(self.shape[1:]))
        rows = int(np.prod(outer)) if outer else 1
        return (*outer, self.n_bytes // rows)


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    fields: dict[str, Value]  # every metadata key but the arrays
    tensors: tuple[TensorInfo, ...]
    version: int
    # with ``read_gguf_header(path, with_arrays=True)``: each array's values, by key
    array_values: dict[str, list] | None = None

    def read(self, tensor: TensorInfo) -> np.ndarray:
        """``tensor``'s bytes, uint8 shaped as :attr:`TensorInfo.byte_shape`."""
        data = np.empty(tensor.n_bytes, dtype=np.uint8)
        try:
            with self.path.open("rb") as handle:
                handle.seek(tensor.offset)
                done = handle.readinto(memoryview(data))
        except OSError as error:
            raise ModelLoadError(f"{self.path}: cannot read tensor {tensor.name} ({error})") \
                from error
        if done != tensor.n_bytes:
            raise ModelLoadError(f"{self.path}: truncated GGUF (tensor {tensor.name} ends "
                                 "past the end of the file)")
        return data.reshape(tensor.byte_shape)

    def map(self, tensor: TensorInfo) -> np.ndarray:
        """:meth:`read`'s bytes mapped copy-on-write: only the pages touched become resident."""
        try:
            data = np.memmap(self.path, dtype=np.uint8, mode="c", offset=tensor.offset,
                             shape=(tensor.n_bytes,))
        except (OSError, ValueError) as error:
            raise ModelLoadError(f"{self.path}: cannot map tensor {tensor.name} ({error})") \
                from error
        return data.reshape(tensor.byte_shape)


def read_gguf_header(path: Path, with_arrays: bool = False) -> GGUFFile:
    """Parse ``path``'s header; a file that cannot be read, is not a GGUF of version 2 or 3, is cut
    short or names a type GGML does not have raises ModelLoadError naming it. ``with_arrays``: the
    arrays' values too (the vocabulary: what a conversion reads), each read in bulk. Without
    them, one parse per version of the file (path, size, mtime) serves a start's every read."""
    try:
        stat = path.stat()
        return (_parse_file(path, stat.st_size, with_arrays=True) if with_arrays
                else _header(path, stat.st_size, stat.st_mtime_ns))
    except OSError as error:
        raise ModelLoadError(f"{path}: cannot read ({error})") from error
    except (struct.error, UnicodeDecodeError) as error:
        raise ModelLoadError(f"{path}: corrupt or truncated GGUF ({error})") from error


@functools.lru_cache(maxsize=4)
def _header(path: Path, size: int, _mtime_ns: int) -> GGUFFile:
    return _parse_file(path, size, with_arrays=False)


def _parse_file(path: Path, size: int, with_arrays: bool) -> GGUFFile:
    with path.open("rb") as handle:
        if handle.read(4) != _MAGIC:
            raise ModelLoadError(f"{path}: not a model (expected a GGUF file or an HF folder)")
        if size < 24:
            raise ModelLoadError(f"{path}: corrupt or truncated GGUF (no header)")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return _parse(path, view, with_arrays)


class _Cursor:
    """Reads little-endian values from ``data`` one after another."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Value:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        length = self.take("Q")
        end = self.at + length
        if end > len(self.data):
            raise struct.error("a string runs past the end of the file")
        text = self.data[self.at:end].decode("utf-8")
        self.at = end
        return text


def _parse(path: Path, data: mmap.mmap, with_arrays: bool = False) -> GGUFFile:
    import gguf

    cursor = _Cursor(data)
    cursor.at = 4
    version = cursor.take("I")
    if version not in _VERSIONS:
        raise ModelLoadError(f"{path}: GGUF version {version} (this reads versions 2 and 3, "
                             "little-endian)")
    tensor_count, field_count = cursor.take("Q"), cursor.take("Q")
    fields: dict[str, Value] = {}
    values: dict[str, list] | None = {} if with_arrays else None
    for _ in range(field_count):
        key = cursor.string()
        kind = cursor.take("I")
        if kind == ARRAY and values is not None:
            values[key] = _array(cursor)
        elif kind == ARRAY:
            _skip_array(cursor)
        else:
            fields[key] = _value(cursor, kind)
    infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        shape = tuple(cursor.take("Q") for _ in range(cursor.take("I")))
        type_id, offset = cursor.take("I"), cursor.take("Q")
        infos.append((name, type_id, shape, offset))
    alignment = int(fields.get("general.alignment", _DEFAULT_ALIGNMENT))
    if alignment < 1 or alignment & (alignment - 1):
        raise ModelLoadError(f"{path}: general.alignment {alignment} is not a power of two")
    start = -(-cursor.at // alignment) * alignment
    tensors = []
    for name, type_id, shape, offset in infos:
        try:
            qtype = gguf.GGMLQuantizationType(type_id)
        except ValueError:
            raise ModelLoadError(f"{path}: tensor {name} has type {type_id}, "
                                 "which GGML does not have") from None
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        elements = int(np.prod(shape)) if shape else 1
        tensor = TensorInfo(name, qtype.name, shape, start + offset,
                            elements // block_size * type_size)
        if tensor.offset + tensor.n_bytes > len(data):
            raise ModelLoadError(f"{path}: truncated GGUF (tensor {name} ends past the end "
                                 "of the file)")
        tensors.append(tensor)
    return GGUFFile(path, fields, tuple(tensors), version, values)


def _value(cursor: _Cursor, kind: int) -> Value:
    if kind == STRING:
        return cursor.string()
    if kind in SCALARS:
        return cursor.take(SCALARS[kind])
    raise struct.error(f"unknown metadata value type {kind}")


def _array(cursor: _Cursor) -> list:
    """An array's values (nested arrays as lists), numbers converted all at once."""
    kind, length = cursor.take("I"), cursor.take("Q")
    if kind in SCALARS:
        dtype = np.dtype("<" + SCALARS[kind])
        end = cursor.at + length * dtype.itemsize
        if end > len(cursor.data):
            raise struct.error("an array runs past the end of the file")
        values = np.frombuffer(cursor.data, dtype, length, cursor.at).tolist()
        cursor.at = end
        return values
    if kind == STRING:
        return [cursor.string() for _ in range(length)]
    if kind == ARRAY:
        return [_array(cursor) for _ in range(length)]
    raise struct.error(f"unknown metadata value type {kind}")


def _skip_array(cursor: _Cursor) -> None:
    """Step over an array (of any depth), keeping nothing."""
    kind, length = cursor.take("I"), cursor.take("Q")
    if kind in SCALARS:
        cursor.at += length * struct.calcsize("<" + SCALARS[kind])
    elif kind == STRING:
        for _ in range(length):
            cursor.at += 8 + struct.unpack_from("<Q", cursor.data, cursor.at)[0]
    elif kind == ARRAY:
        for _ in range(length):
            _skip_array(cursor)
    else:
        raise struct.error(f"unknown metadata value type {kind}")
    if cursor.at > len(cursor.data):
        raise struct.error("an array runs past the end of the file")
