"""A small decode batch through every decoder layer in one C call (decoder.c)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import NamedTuple

import torch

from pagedchat.kernels.cpu.attention import _plan
from pagedchat.kernels.cpu.build import FLOAT, INT, P, declare, kernel, load_products, typed_kernel
from pagedchat.kernels.cpu.linear import BLOCKED_ROWS, blocked_width
from pagedchat.kernels.cpu.quant import thread_split
from pagedchat.kernels.kv_int8 import head_dim_of
from pagedchat.kernels.quant import QuantizedWeight

declare({"decoder_layers": (INT, [P, INT, P, P, P])})

Weight = torch.Tensor | QuantizedWeight

# The rows of a step the stack takes where every product is quantized: up to a decode step
# at the default max_num_seqs, since the per-layer path takes the same quantized product at
# any row count. Where a weight is packed, BLOCKED_ROWS: past them the per-layer path takes
# oneDNN's product, which the stack cannot call.
QUANTIZED_ROWS = range(1, 257)

# decoder.c's statuses besides 0, raised as the layers' own kernels raise them
_FAILURES = {
    2: (MemoryError, "paged attention: out of memory for the score buffer"),
    3: (MemoryError, "linear: out of memory for the decoded weights"),
    4: (ValueError, "linear: a quantization the kernel does not know")}


class LayerTensors(NamedTuple):
    """One decoder layer's weights (packed or quantized, as the model holds them) and
    caches. ``post_norm`` adds
    the residual before the MLP. Norms a layer may lack (None): ``q_norm``/``k_norm`` (Qwen 3,
    Gemma 3), Gemma 3's ``attention_out_norm`` and ``mlp_out_norm`` on attention's and the
    MLP's outputs. ``rope`` and ``group``: the layer's rope table and attention group."""

    input_norm: torch.Tensor
    qkv: Weight
    qkv_bias: torch.Tensor | None
    o: Weight
    post_norm: torch.Tensor
    gate_up: Weight
    down: Weight
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    attention_out_norm: torch.Tensor | None = None
    mlp_out_norm: torch.Tensor | None = None
    rope: int = 0
    group: int = 0


# One attention group's metadata for a step (see kv_groups.py): slot_mapping, block_tables,
# context_lens, query_start_loc and window, as AttentionMetadata holds them.
GroupMetadata = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int | None]
# a norm a layer may lack, in _DecoderLayer's order after the caches
_OPTIONAL_NORMS = ("q_norm", "k_norm", "attention_out_norm", "mlp_out_norm")
ACTIVATIONS = ("silu", "gelu_tanh")


class _QuantSegment(ctypes.Structure):
    """``QuantSegment`` in ``decoder.c``."""

    _fields_ = [("data", P), ("type", INT), ("rows", INT)]


class _Product(ctypes.Structure):
    """``Product`` in ``decoder.c``: a blocked weight, or quantized segments."""

    _fields_ = [("blocked", P), ("padded", INT), ("segments", ctypes.POINTER(_QuantSegment)),
                ("count", INT)]


class _DecoderLayer(ctypes.Structure):
    """``DecoderLayer`` in ``decoder.c``."""

    _fields_ = [(name, P) for name in ("input_norm", "post_norm", "qkv_bias")] + \
               [(name, _Product) for name in ("qkv", "o", "gate_up", "down")] + \
               [("k_cache", P), ("v_cache", P)] + \
               [(name, P) for name in _OPTIONAL_NORMS] + \
               [(name, INT) for name in ("block_size", "rope", "group")]


class _RopeRows(ctypes.Structure):
    """``RopeRows`` in ``decoder.c``."""

    _fields_ = [("cos", P), ("sin", P)]


class _AttentionGroup(ctypes.Structure):
    """``AttentionGroup`` in ``decoder.c``."""

    _fields_ = [(name, P) for name in ("slots", "block_tables", "context_lens", "query_start",
                                        "row_ids", "row_seqs")] + \
               [("attention_rows", INT), ("max_blocks", INT), ("window", INT)]


class _DecoderStep(ctypes.Structure):
    """``DecoderStep`` in ``decoder.c``."""

    _fields_ = [(name, INT) for name in ("rows", "hidden", "heads", "kv_heads", "head_dim",
                                          "intermediate", "num_threads", "gelu")] + \
               [("kv8_attention", P), ("eps", FLOAT), ("scale", FLOAT)] + \
               [("ropes", ctypes.POINTER(_RopeRows)),
                ("groups", ctypes.POINTER(_AttentionGroup))] + \
               [(name, P) for name in ("h", "qkv", "q", "attention", "gate_up", "act", "wide",
                                        "bounds")]


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _product(weight: Weight, keep: list) -> _Product:
    """A product's weight as the C decoder reads it; a segment array it points at goes
    into ``keep``, which the caller holds as long as the structure."""
    if isinstance(weight, QuantizedWeight):
        segments = (_QuantSegment * len(weight.segments))(*(
            _QuantSegment(s.data.data_ptr(), s.kernel_type(weight.int8_activations), s.rows)
            for s in weight.segments))
        keep.append(segments)
        return _Product(None, 0, segments, len(weight.segments))
    return _Product(torch.ops.mkldnn.data_ptr(weight), blocked_width(weight), None, 0)


def _bias(layer: LayerTensors) -> torch.Tensor | None:
    """The qkv bias as its product reads it: float32 for a quantized weight (as
    ``quantized_linear`` passes it), else as the model holds it."""
    if layer.qkv_bias is None or not isinstance(layer.qkv, QuantizedWeight):
        return layer.qkv_bias
    return layer.qkv_bias.float().contiguous()


class DecoderStack:
    """Every decoder layer in one C call, for steps of up to ``QUANTIZED_ROWS`` (every product
    quantized) or ``BLOCKED_ROWS`` (some packed) rows, all decodes or short chunks: the
    per-layer calls' kernels in the same order (the same result, bit for bit), without their
    Python dispatch. Built by :func:`decoder_stack`, which checks the weights."""

    def __init__(self, layers: list[LayerTensors], num_heads: int, eps: float,
                 scale: float, activation: str = "silu") -> None:
        first = layers[0]
        self.hidden = first.input_norm.shape[0]
        self.heads = num_heads
        self.kv_heads = first.k_cache.shape[2]
        self.head_dim = head_dim_of(first.k_cache)
        int8 = first.k_cache.dtype == torch.int8  # its attention apart (build.APART)
        part = typed_kernel("paged_attention_kv8_part", first.input_norm.dtype) if int8 else None
        self.kv8 = None if part is None else ctypes.cast(part, P).value
        self.qkv_width = first.qkv.shape[0]
        self.intermediate = first.gate_up.shape[0] // 2
        self.eps, self.scale = eps, scale
        self.gelu = activation == "gelu_tanh"
        self.num_ropes = 1 + max(layer.rope for layer in layers)
        self.num_groups = 1 + max(layer.group for layer in layers)
        self.dtype = first.input_norm.dtype
        self._decoder = kernel("decoder_layers", first.input_norm)
        self.rows = QUANTIZED_ROWS if all(
            isinstance(weight, QuantizedWeight) for layer in layers
            for weight in (layer.qkv, layer.o, layer.gate_up, layer.down)) else BLOCKED_ROWS
        biases, segments = [_bias(layer) for layer in layers], []
        self._tensors = layers, biases, segments  # keeps what the pointers point at alive
        self._layers = (_DecoderLayer * len(layers))(*(
            _DecoderLayer(
                layer.input_norm.data_ptr(), layer.post_norm.data_ptr(), _pointer(bias),
                *(_product(weight, segments) for weight in (layer.qkv, layer.o,
                                                            layer.gate_up, layer.down)),
                layer.k_cache.data_ptr(), layer.v_cache.data_ptr(),
                *(_pointer(getattr(layer, name)) for name in _OPTIONAL_NORMS),
                layer.k_cache.shape[1], layer.rope, layer.group)
            for layer, bias in zip(layers, biases, strict=True)))
        load_products(segment.type for array in segments for segment in array)  # formats used
        # how the quantized products' columns are split among the threads: equal at first,
        # then as the decoder finds the threads' speeds (rebalance in kernels.h)
        self.bounds: ctypes.Array | None = None

    def __call__(self, x: torch.Tensor, ropes: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 groups: Sequence[GroupMetadata]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The last layer's output and the residual still to be added (as the layers return
        them), or None where this step is not one for the stack. ``ropes``: each rope table's
        (cos, sin) rows; ``groups``: each attention group's metadata."""
        rows = x.shape[0]
        if (rows not in self.rows or x.dtype != self.dtype or len(ropes) != self.num_ropes
                or len(groups) != self.num_groups
                or any(cos.dtype != self.dtype for cos, _ in ropes)):
            return None
        plans = [_plan(tables, context_lens, starts)
                 for _, tables, context_lens, starts, _ in groups]
        if any(plan.long_chunks for plan in plans):
            return None
        x = x.contiguous()
        ropes = [(cos.contiguous(), sin.contiguous()) for cos, sin in ropes]
        slots = [slot_mapping.to(torch.int64).contiguous() for slot_mapping, *_ in groups]
        residual = torch.empty_like(x)
        q_size = self.heads * self.head_dim
        scratch = [torch.empty(rows, width, dtype=self.dtype) for width in (
            self.hidden, self.qkv_width, q_size, q_size, 2 * self.intermediate, self.intermediate)]
        # the inputs of quantized products, widened, in a bfloat16 step
        wide = (torch.empty(rows, max(self.hidden, q_size, self.intermediate))
                if self.dtype == torch.bfloat16 else None)
        threads = torch.get_num_threads()
        self.bounds = thread_split(self.bounds, threads)
        rope_rows = (_RopeRows * len(ropes))(*(
            _RopeRows(cos.data_ptr(), sin.data_ptr()) for cos, sin in ropes))
        attention_groups = (_AttentionGroup * len(plans))(*(
            _AttentionGroup(group_slots.data_ptr(), plan.tables.data_ptr(),
                            plan.context_lens.data_ptr(), plan.query_start_loc.data_ptr(),
                            plan.rows.data_ptr(), plan.row_seqs.data_ptr(), len(plan.rows),
                            plan.tables.shape[1], group[4] or 0)
            for group_slots, plan, group in zip(slots, plans, groups, strict=True)))
        step = _DecoderStep(
            rows, self.hidden, self.heads, self.kv_heads, self.head_dim, self.intermediate,
            threads, self.gelu, self.kv8, self.eps, self.scale, rope_rows, attention_groups,
            *(buffer.data_ptr() for buffer in scratch), _pointer(wide),
            ctypes.addressof(self.bounds))
        status = self._decoder(
            self._layers, len(self._layers), ctypes.byref(step), x.data_ptr(), residual.data_ptr())
        if status != 0:
            error, message = _FAILURES[status]
            raise error(message)
        return x, residual


def _product_ok(weight: Weight, dtype: torch.dtype, in_features: int) -> bool:
    """Whether the C decoder takes this product: GGML blocks (any format the quantized
    product takes, on the CPU), or a weight packed in the blocked layout of the step's type."""
    if isinstance(weight, QuantizedWeight):
        return weight.in_features == in_features and all(
            s.data.is_cpu and s.data.is_contiguous() for s in weight.segments)
    return (weight.is_mkldnn and weight.dtype == dtype and blocked_width(weight) is not None)


def decoder_stack(layers: list[LayerTensors], num_heads: int, eps: float,
                  scale: float, activation: str = "silu") -> DecoderStack | None:
    """The layers as one C call where they can be (float32 or bfloat16 on the CPU, every
    weight packed in the C product's blocked layout or quantized, caches contiguous, of the
    step's type or int8, ``activation`` in ``ACTIVATIONS``); else None (layer by layer)."""
    if (not layers or activation not in ACTIVATIONS
            or kernel("decoder_layers", layers[0].input_norm) is None):
        return None
    dtype = layers[0].input_norm.dtype
    hidden = layers[0].input_norm.shape[0]
    cache_dtype = layers[0].k_cache.dtype if layers[0].k_cache.dtype == torch.int8 else dtype
    if cache_dtype == torch.int8 and typed_kernel("paged_attention_kv8_part", dtype) is None:
        return None
    shape = (layers[0].k_cache.shape[2], head_dim_of(layers[0].k_cache),
             layers[0].gate_up.shape[0], layers[0].qkv.shape[0])
    for layer in layers:
        q_size = num_heads * head_dim_of(layer.k_cache)
        intermediate = layer.gate_up.shape[0] // 2
        products = ((layer.qkv, hidden), (layer.o, q_size), (layer.gate_up, hidden),
                    (layer.down, intermediate))
        norms = [getattr(layer, name) for name in _OPTIONAL_NORMS]
        plain = [layer.input_norm, layer.post_norm] + [n for n in norms if n is not None]
        if layer.qkv_bias is not None:
            plain.append(layer.qkv_bias)
        if (layer.q_norm is None) != (layer.k_norm is None):
            return None
        if (layer.k_cache.shape[2], head_dim_of(layer.k_cache), layer.gate_up.shape[0],
                layer.qkv.shape[0]) != shape:
            return None
        if not all(_product_ok(weight, dtype, width) for weight, width in products):
            return None
        if not all(tensor.dtype == dtype and tensor.is_cpu and tensor.is_contiguous()
                   for tensor in plain):
            return None
        if not all(cache.dtype == cache_dtype and cache.is_cpu and cache.is_contiguous()
                   for cache in (layer.k_cache, layer.v_cache)):
            return None
    return DecoderStack(layers, num_heads, eps, scale, activation)
