"""A GGUF file's tensors under transformers' names, quantized ones kept in their blocks. Undoing
llama.cpp's rotary permutation of q and k rows (``llama``) moves whole rows of blocks, so each
weight de-quantizes to transformers' value; F32, F16, BF16 become float32 likewise. A
``gemma3`` norm stored as ``1 + w`` has the 1 subtracted in float32, as transformers does."""

from __future__ import annotations

import contextlib
import copy
import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedchat.engine.errors import ModelLoadError
from pagedchat.engine.loading.gguf_file import GGUFFile, TensorInfo, read_gguf_header
from pagedchat.engine.loading.gguf_metadata import parse_metadata, read_metadata
from pagedchat.kernels.cpu.build import prepare
from pagedchat.kernels.quant import FORMATS, INT8_ACTIVATIONS, QuantizedWeight

if TYPE_CHECKING:
    from transformers import PretrainedConfig

Weight = torch.Tensor | QuantizedWeight

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                 "output": "lm_head"}
_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_ARCHITECTURE_LAYER_NAMES = {
    # Gemma 3 names its four norms per layer and has the QK-norm; its "ffn_norm" is the norm
    # before the MLP, not Llama's norm after attention
    "gemma3": {**_LAYER_NAMES, **_QK_NORMS, "ffn_norm": "pre_feedforward_layernorm",
               "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    # Qwen 3 adds the per-head QK-norm to Llama's layer
    "qwen3": {**_LAYER_NAMES, **_QK_NORMS},
    # Phi-3 keeps q/k/v in one tensor, and gate and up in one ("ffn_up"), as transformers does
    "phi3": {**_LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}}
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")
_PLAIN = ("F32", "F16", "BF16")


def write_metadata(path: Path, folder: Path) -> None:
    """An HF folder for ``path`` with its config, generation config and tokenizer, and no
    weights: what the engine reads beside the GGUF's own tensors. Reads the metadata only."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        with header_parsed_once():
            config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as error:
        raise ModelLoadError(f"{path}: transformers could not read the GGUF ({error})") from error
    add_rope_freqs(config, path)
    config.save_pretrained(folder)
    GenerationConfig.from_model_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@contextmanager
def header_parsed_once() -> Iterator[None]:
    """Within this block transformers' parses of a GGUF's header (for the config, the tokenizer,
    the tensors) read one parse of it with its arrays (:mod:`.gguf_metadata`)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    gguf_integration = reader = None
    with contextlib.suppress(ImportError):  # transformers' own reader, since 5.x
        from transformers.integrations import gguf as gguf_integration
        from transformers.integrations.gguf import reader
    parse = getattr(gguf_utils, "load_gguf_checkpoint", None)
    read = getattr(reader, "read_gguf_metadata", None)
    header_of = functools.cache(lambda file: read_gguf_header(Path(file), with_arrays=True))
    metadata_of = functools.cache(lambda file: parse_metadata(parse, header_of(file)))

    def parse_once(file, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return parse_metadata(parse, header_of(str(file)), return_tensors=return_tensors,
                                  **kwargs)
        metadata = metadata_of(str(file))  # the callers read the config: the vocabulary is shared
        return {**metadata, "config": copy.deepcopy(metadata["config"])}

    def read_once(file, string_arrays=()):
        return read_metadata(header_of(str(file)), string_arrays) or read(file, string_arrays)

    patches = [patch for patch in ((gguf_utils, "load_gguf_checkpoint", parse, parse_once),
                                   (reader, "read_gguf_metadata", read, read_once),
                                   (gguf_integration, "read_gguf_metadata", read, read_once))
               if patch[2] is not None]
    for module, name, _, new in patches:
        setattr(module, name, new)
    try:
        yield
    finally:
        for module, name, old, _ in patches:
            setattr(module, name, old)


def add_rope_freqs(config: PretrainedConfig, path: Path) -> None:
    """Set ``config.rope_freqs`` to the file's ``rope_freqs`` tensor, where it has one: the
    divisors of the rope's inverse frequencies llama.cpp applies (a Llama 3 file's rope
    scaling, which its metadata does not state and transformers does not read)."""
    header = read_gguf_header(path)
    for tensor in header.tensors:
        if tensor.name == "rope_freqs.weight":
            config.rope_freqs = _read_tensor(header, tensor).flatten().tolist()


def hf_name(name: str, architecture: str = "llama") -> str | None:
    """transformers' name for a GGUF tensor name of a file of ``architecture``, or None for
    one it does not load (such as llama.cpp's precomputed ``rope_freqs``)."""
    if (match := _LAYER.match(name)) is not None:
        layer, part, kind = match.groups()
        names = _ARCHITECTURE_LAYER_NAMES.get(architecture, _LAYER_NAMES)
        return f"model.layers.{layer}.{names[part]}.{kind}" if part in names else None
    stem, _, kind = name.rpartition(".")
    return f"{_GLOBAL_NAMES[stem]}.{kind}" if stem in _GLOBAL_NAMES else None


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """The row order undoing llama.cpp's rotary permutation of a q or k projection: row
    ``h, j, i`` of the result (head, half, index in the half) is row ``h, i, j`` of the file."""
    half = rows // heads // 2
    return torch.arange(rows).view(heads, half, 2).transpose(1, 2).reshape(rows)


def prepare_products(header: GGUFFile) -> None:
    """Start compiling the file's CPU products (and a Q8_0 head's 8-bit screen's: GreedyHead)."""
    untied = any(tensor.name == "output.weight" for tensor in header.tensors)
    kinds = {t.name: FORMATS[t.type_name].type_id for t in header.tensors if t.type_name in FORMATS}
    head = kinds.get("output.weight" if untied else "token_embd.weight")
    screened = {head | INT8_ACTIVATIONS} if head == FORMATS["Q8_0"].type_id else set()
    prepare({*kinds.values(), *screened})


def read_gguf_weights(path: Path, num_heads: int, num_kv_heads: int) -> dict[str, Weight]:
    """Every tensor transformers loads from ``path``, by its transformers name: quantized
    ones as :class:`QuantizedWeight`, the others as float32 tensors."""
    header = read_gguf_header(path)
    architecture = header.fields.get("general.architecture")
    prepare_products(header)  # a first start's compile, while the tensors are read
    weights: dict[str, Weight] = {}
    for tensor in header.tensors:
        if (name := hf_name(tensor.name, architecture)) is None:
            continue
        weight = _read_tensor(header, tensor)
        if architecture == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = num_heads if ".q_proj." in name else num_kv_heads
            order = unpermute_rows(weight.shape[0], heads)
            weight = weight.take_rows(order) if isinstance(weight, QuantizedWeight) \
                else weight[order]
        if architecture == "gemma3" and tensor.name.endswith("norm.weight"):
            if isinstance(weight, QuantizedWeight):
                raise ModelLoadError(f"{path}: norm {tensor.name} is quantized; norms are read "
                                     "as floats")
            weight = weight - 1  # the stored 1 + w, in float32: transformers' w
        weights[name] = weight
    return weights


def _read_tensor(header: GGUFFile, tensor: TensorInfo) -> Weight:
    """``tensor`` as the engine keeps it: a quantized one's blocks mapped from the file (no
    copy to make at load; an untied embedding's rows resident only once looked up)."""
    kind = tensor.type_name
    width = int(tensor.shape[0])  # GGUF lists the innermost dimension first
    if kind in _PLAIN:
        import gguf

        values = gguf.quants.dequantize(header.read(tensor), gguf.GGMLQuantizationType[kind])
        shape = [int(n) for n in reversed(tensor.shape)]
        return torch.from_numpy(np.asarray(values, dtype=np.float32)).reshape(shape)
    if kind not in FORMATS:
        raise ModelLoadError(
            f"{header.path}: tensor {tensor.name} is {kind}, which --weights gguf does not "
            f"keep quantized (it reads {', '.join(FORMATS)}); use --weights float32")
    blocks = torch.from_numpy(header.map(tensor))
    return QuantizedWeight.from_blocks(kind, blocks.reshape(-1, blocks.shape[-1]), width)
