"""GGML's block-quantized weight formats, kept as they are in a GGUF file, and their torch
reference: what each stored byte means, as float32.

A quantized row of ``in_features`` values is ``in_features / block_size`` blocks of
``type_size`` bytes each. :func:`dequantize` gives, for every weight, exactly the float32
that gguf-py's ``gguf.quants.dequantize`` gives (what transformers loads a GGUF with):
each value is computed with the same float32 operations in the same order (a scale times
the integer, then the offset added or subtracted), so a product over de-quantized values
differs from transformers' only in the order of its sums.

A :class:`QuantizedWeight` is a stack of row segments, each in one format (llama.cpp may
quantize the parts of a fused weight differently; none is re-quantized); adjacent segments
of one format are merged, so the usual fused weight is one segment."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class QFormat:
    """One GGML block format; ``type_id`` is its number in GGML (and in the C kernels)."""

    name: str
    type_id: int
    block_size: int
    type_size: int

    def row_bytes(self, width: int) -> int:
        if width % self.block_size:
            raise ValueError(f"{self.name}: a row of {width} values is not whole blocks of "
                             f"{self.block_size}")
        return width // self.block_size * self.type_size


FORMATS: dict[str, QFormat] = {f.name: f for f in (
    QFormat("Q4_0", 2, 32, 18), QFormat("Q4_1", 3, 32, 20), QFormat("Q5_0", 6, 32, 22),
    QFormat("Q5_1", 7, 32, 24), QFormat("Q8_0", 8, 32, 34), QFormat("Q4_K", 12, 256, 144),
    QFormat("Q5_K", 13, 256, 176), QFormat("Q6_K", 14, 256, 210))}


# flags the C kernels take on a type number: a product with 8-bit activations; a Q4_1
# segment whose weights are exact sums (Segment.exact_offsets)
INT8_ACTIVATIONS = 0x100
EXACT_OFFSETS = 0x200


@dataclass(frozen=True)
class Segment:
    """Consecutive output rows of a weight in one format: ``data`` is uint8
    ``[rows, row_bytes]``, each row its blocks in file order."""

    format: QFormat
    data: torch.Tensor

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @cached_property
    def exact_offsets(self) -> bool:
        """Whether every weight d * q + m of this Q4_1 segment is exact in float32: the
        sum is a whole multiple of the lower of d's and m's lowest bits and under 2^24 of
        them. Then a kernel may take a block's sum as d * (x . q) + m * sum(x) and still
        multiply by the reference's weights. False for the other formats."""
        if self.format.name != "Q4_1":
            return False
        blocks = self.data.reshape(-1, self.format.type_size)
        d, m = _half(blocks, 0).double(), _half(blocks, 2).double()
        bound = 2.0 ** 24 * torch.minimum(_lowest_bit(d), _lowest_bit(m))
        return bool((15 * d.abs() + m.abs() < bound).all())

    def kernel_type(self, int8_activations: bool) -> int:
        """The type number the C kernels take for this segment, flags included."""
        if int8_activations:
            return self.format.type_id | INT8_ACTIVATIONS
        return self.format.type_id | (EXACT_OFFSETS if self.exact_offsets else 0)


class QuantizedWeight:
    """A ``[out_features, in_features]`` weight as GGML blocks, in row segments, whose rows can
    be taken and weights stacked without touching a block: a fused projection keeps its parts'
    blocks where they are (mapped from the file, shared with other processes), one segment
    each. ``int8_activations``: products round their input to 8 bits first
    (:func:`round_activations`), as llama.cpp does."""

    def __init__(self, segments: Sequence[Segment], in_features: int,
                 int8_activations: bool = False) -> None:
        for segment in segments:
            if segment.data.dtype != torch.uint8 or segment.data.dim() != 2:
                raise ValueError("a quantized segment is a 2-D uint8 tensor")
            if segment.data.shape[1] != segment.format.row_bytes(in_features):
                raise ValueError(f"{segment.format.name}: rows of {segment.data.shape[1]} "
                                 f"bytes do not hold {in_features} values")
        self.segments = tuple(Segment(s.format, s.data.contiguous()) for s in segments if s.rows)
        self.in_features, self.int8_activations = in_features, int8_activations
        self.out_features = sum(s.rows for s in self.segments)

    @classmethod
    def from_blocks(cls, format_name: str, data: torch.Tensor, in_features: int) -> QuantizedWeight:
        """One segment: ``data`` holds the blocks of each row, as uint8 ``[rows, bytes]``."""
        if format_name not in FORMATS:
            raise ValueError(f"unsupported quantization {format_name!r} "
                             f"(supported: {', '.join(FORMATS)})")
        return cls([Segment(FORMATS[format_name], data)], in_features)

    @classmethod
    def stack(cls, weights: Sequence[QuantizedWeight]) -> QuantizedWeight:
        """The weights' rows one after the other (a fused projection)."""
        widths = {weight.in_features for weight in weights}
        if len(widths) != 1:
            raise ValueError(f"stacked weights differ in width: {sorted(widths)}")
        return cls([s for weight in weights for s in weight.segments], widths.pop(),
                   any(weight.int8_activations for weight in weights))

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    @property
    def nbytes(self) -> int:
        return sum(s.data.numel() for s in self.segments)

    def take_rows(self, index: torch.Tensor | slice) -> QuantizedWeight:
        """The rows ``index`` picks (a slice, or int64 row numbers in any order), as a new
        weight of the same blocks: shared for a slice of whole segments, else copied (a shard
        does not keep the rest of its weight alive)."""
        if isinstance(index, slice) and index.step in (None, 1):
            return self._row_range(*index.indices(self.shape[0])[:2])
        if isinstance(index, torch.Tensor) and len(self.segments) == 1:  # one gather (checked)
            return QuantizedWeight([Segment(s.format, s.data[index]) for s in self.segments],
                                   self.in_features, self.int8_activations)
        rows = torch.arange(self.shape[0])[index]
        ends = torch.tensor([s.rows for s in self.segments]).cumsum(0)
        owner = torch.bucketize(rows, ends, right=True)
        # each run of picked rows from one segment is one gather
        cuts = [0, *((owner[1:] != owner[:-1]).nonzero().flatten() + 1).tolist(), len(rows)]
        pieces: list[Segment] = []
        for begin, end in zip(cuts[:-1], cuts[1:], strict=True):
            if begin == end:
                continue
            i = int(owner[begin])
            segment = self.segments[i]
            taken = segment.data[rows[begin:end] - (int(ends[i]) - segment.rows)]
            if pieces and pieces[-1].format == segment.format:  # copies both: one segment
                taken = torch.cat([pieces.pop().data, taken])
            pieces.append(Segment(segment.format, taken))
        return QuantizedWeight(pieces, self.in_features, self.int8_activations)

    def _row_range(self, start: int, stop: int) -> QuantizedWeight:
        pieces, first = [], 0
        for segment in self.segments:
            begin, end = max(start - first, 0), min(stop - first, segment.rows)
            if begin < end:
                whole = end - begin == segment.rows
                rows = segment.data if whole else segment.data[begin:end].clone()
                pieces.append(Segment(segment.format, rows))
            first += segment.rows
        return QuantizedWeight(pieces, self.in_features, self.int8_activations)

    def __getitem__(self, rows: slice) -> QuantizedWeight:
        return self.take_rows(rows)

    def narrow(self, dim: int, start: int, length: int) -> QuantizedWeight:
        """As ``Tensor.narrow``: rows (dim 0), or input columns (dim 1) where the cut falls
        between blocks (a row-parallel shard)."""
        if dim == 0:
            return self.take_rows(slice(start, start + length))
        pieces = []
        for segment in self.segments:
            fmt = segment.format
            if start % fmt.block_size or length % fmt.block_size:
                raise ValueError(f"{fmt.name}: columns [{start}, {start + length}) cut its "
                                 f"blocks of {fmt.block_size}")
            first = start // fmt.block_size * fmt.type_size
            pieces.append(Segment(fmt, segment.data[:, first:first + fmt.row_bytes(length)]))
        return QuantizedWeight(pieces, length, self.int8_activations)

    def __repr__(self) -> str:
        parts = ", ".join(f"{s.format.name}x{s.rows}" for s in self.segments)
        int8 = ", int8 activations" if self.int8_activations else ""
        return f"QuantizedWeight({tuple(self.shape)}, {parts}{int8})"


def _half(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The float16 at byte ``at`` of every block, as float32 ``[blocks, 1]``."""
    return blocks[:, at:at + 2].contiguous().view(torch.float16).float()


def _lowest_bit(halves: torch.Tensor) -> torch.Tensor:
    """The place value of the lowest bit a float16 value (here as float64) may have set:
    2^(e - 10) for 2^e <= |v| < 2^(e + 1), 2^-24 for a subnormal, infinity for zero."""
    _, exponent = torch.frexp(halves)
    lowest = torch.clamp(torch.ldexp(torch.ones_like(halves), exponent - 11), min=2.0 ** -24)
    return torch.where(halves == 0, torch.inf, lowest)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Bytes ``[..., n]`` to ``[..., 2n]``: every low nibble, then every high one."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _high_bits(qh: torch.Tensor) -> torch.Tensor:
    """The 32 bits of each block's little-endian ``qh`` (4 bytes), bit j at column j."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((qh.unsqueeze(-1) >> shifts) & 1).reshape(qh.shape[0], 32)


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins packed in a K-format block's 12 bytes."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def dequantize_blocks(format_name: str, blocks: torch.Tensor) -> torch.Tensor:
    """uint8 ``[n, type_size]`` blocks to float32 ``[n, block_size]``, value for value as
    gguf-py computes them (same float32 operations, same order)."""
    n = blocks.shape[0]
    if format_name == "Q8_0":
        return blocks[:, 2:34].contiguous().view(torch.int8).float() * _half(blocks, 0)
    if format_name == "Q4_0":
        q = _nibbles(blocks[:, 2:18]).to(torch.int8) - 8
        return _half(blocks, 0) * q.float()
    if format_name == "Q4_1":
        q = _nibbles(blocks[:, 4:20]).float()
        return _half(blocks, 0) * q + _half(blocks, 2)
    if format_name in ("Q5_0", "Q5_1"):
        offset = 2 if format_name == "Q5_0" else 4
        qh, qs = blocks[:, offset:offset + 4], blocks[:, offset + 4:offset + 20]
        q = _nibbles(qs) | (_high_bits(qh) << 4)
        if format_name == "Q5_0":
            return _half(blocks, 0) * (q.to(torch.int8) - 16).float()
        return _half(blocks, 0) * q.float() + _half(blocks, 2)
    if format_name in ("Q4_K", "Q5_K"):
        sc, mn = _k_scales(blocks[:, 4:16])
        scale = (_half(blocks, 0) * sc.float()).unsqueeze(-1)
        offset = (_half(blocks, 2) * mn.float()).unsqueeze(-1)
        qs_at = 16 if format_name == "Q4_K" else 48
        q = _nibbles(blocks[:, qs_at:qs_at + 128].reshape(n, 4, 1, 32)).reshape(n, 8, 32)
        if format_name == "Q5_K":
            shifts = torch.arange(8, dtype=torch.uint8).view(1, 8, 1)
            q = q | (((blocks[:, 16:48].unsqueeze(1) >> shifts) & 1) << 4)
        return (scale * q.float() - offset).reshape(n, 256)
    if format_name == "Q6_K":
        ql = _nibbles(blocks[:, 0:128].reshape(n, 2, 64))  # [n, 2 halves, 128]
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
        qh = ((blocks[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 2, 128)
        q = ((ql | (qh << 4)).to(torch.int8) - 32).reshape(n, 16, 16).float()
        scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
        return ((_half(blocks, 208) * scales).unsqueeze(-1) * q).reshape(n, 256)
    raise ValueError(f"unsupported quantization {format_name!r} (supported: {', '.join(FORMATS)})")


def quantize_q8_0(weight: torch.Tensor) -> QuantizedWeight:
    """A float ``[rows, width]`` weight (width a multiple of 32) as Q8_0 blocks, byte for
    byte as gguf-py's quantizer writes them: per 32 values d = max|w| / 127 (stored as
    float16), q = w / d rounded half away from zero, in float32."""
    rows, width = weight.shape
    runs = weight.detach().float().reshape(rows, width // 32, 32)
    d = runs.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    scaled = runs * inverse
    q = (scaled.sign() * (scaled.abs() + 0.5).floor()).to(torch.int8)
    blocks = torch.cat([d.half().view(torch.uint8), q.view(torch.uint8)], dim=-1)
    return QuantizedWeight.from_blocks("Q8_0", blocks.reshape(rows, -1), width)


def _dequantize_segment(segment: Segment) -> torch.Tensor:
    fmt = segment.format
    blocks = segment.data.reshape(-1, fmt.type_size)
    return dequantize_blocks(fmt.name, blocks).reshape(segment.rows, -1)


def dequantize(weight: QuantizedWeight) -> torch.Tensor:
    """The whole weight as float32 ``[out_features, in_features]``."""
    if not weight.segments:
        return torch.empty(0, weight.in_features)
    return torch.cat([_dequantize_segment(s) for s in weight.segments])


# rows de-quantized at a time by the reference product: a vocabulary-sized head (Gemma's
# 262,144 rows) is never held in float32 whole
ROWS_AT_ONCE = 4096


def _dequantized_chunks(weight: QuantizedWeight) -> Iterator[torch.Tensor]:
    """The weight's rows in order, de-quantized to float32 ``ROWS_AT_ONCE`` at a time."""
    for segment in weight.segments:
        for start in range(0, segment.rows, ROWS_AT_ONCE):
            yield _dequantize_segment(
                Segment(segment.format, segment.data[start:start + ROWS_AT_ONCE]))


def row_norms(weight: QuantizedWeight) -> torch.Tensor:
    """Each row's Euclidean norm of a Q8_0 ``weight``, float32 rounded up (never below the norm
    of its exact weights): per block, d^2 times the sum of q^2 (an integer float32 holds
    exactly), ``ROWS_AT_ONCE`` rows at a time, their q widened into one buffer."""
    norms = []
    for segment in weight.segments:
        blocks = segment.data.view(segment.rows, -1, segment.format.type_size)
        q = torch.empty(ROWS_AT_ONCE, blocks.shape[1], 32)
        for start in range(0, segment.rows, ROWS_AT_ONCE):
            rows = blocks[start:start + ROWS_AT_ONCE]
            sums = q[:len(rows)].copy_(rows[:, :, 2:].view(torch.int8)).square_().sum(-1)
            scales = _half(rows.reshape(-1, rows.shape[2]), 0).view(sums.shape).double()
            exact = (scales.square() * sums).sum(-1).sqrt()
            rounded = exact.float()
            norms.append(torch.where(rounded.double() < exact,
                                     rounded.nextafter(torch.tensor(float("inf"))), rounded))
    return torch.cat(norms) if norms else torch.empty(0)


_ONE_127TH, _ZERO = torch.tensor(1 / 127, dtype=torch.float32), torch.tensor(0.0)


def round_activations(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32, last dimension a multiple of 32) as the 8-bit products see it: each
    run of 32 values ``d * q`` for integers ``q`` in [-127, 127], ``d = max|x| * (1/127)``,
    ``q = x * (1/d)`` rounded to the nearest integer, ties to even (the C kernels round the
    same way, so the same ``q``)."""
    runs = x.reshape(*x.shape[:-1], -1, 32)
    d = runs.abs().amax(-1, keepdim=True).mul_(_ONE_127TH)
    return runs.mul(torch.where(d > 0, d.reciprocal(), _ZERO)).round_().mul_(d).reshape(x.shape)


def quantized_linear(x: torch.Tensor, weight: QuantizedWeight,
                     bias: torch.Tensor | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` in float32 over the de-quantized weight (``ROWS_AT_ONCE`` rows
    at a time), in ``x``'s dtype (float32 or bfloat16); written into ``out`` where given.
    With ``weight.int8_activations``, x rounded first (:func:`round_activations`). The C
    kernels meet this within float32's reach; one row of x times Q4_K or Q6_K on AVX2 and
    AVX-512 keeps each value of x to 2^-21 of the largest in its group of 256 (quant_split.c)."""
    wide = round_activations(x.float()) if weight.int8_activations else x.float()
    result = torch.empty(*x.shape[:-1], weight.shape[0])
    first = 0
    for rows in _dequantized_chunks(weight):
        result[..., first:first + len(rows)] = F.linear(wide, rows)
        first += len(rows)
    if bias is not None:
        result += bias.float()
    result = result.to(x.dtype)
    return result if out is None else out.copy_(result)


def quantized_embedding(ids: torch.Tensor, weight: QuantizedWeight,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The de-quantized rows of ``weight`` for token ``ids``: ``[*ids.shape, width]``."""
    flat = ids.reshape(-1).to(torch.int64)
    if flat.numel() and not (0 <= int(flat.min()) and int(flat.max()) < weight.shape[0]):
        raise IndexError(f"embedding: ids outside [0, {weight.shape[0]})")
    rows = dequantize(weight.take_rows(flat)) if flat.numel() else torch.empty(
        0, weight.in_features)
    return rows.to(dtype).reshape(*ids.shape, weight.in_features)
