"""The model's shape, read straight from its ``config.json``: transformers' config classes
import the rope helpers, and with them torch._dynamo, sympy and accelerate, a large resident
cost for a few integers. Only a rope type other than the default asks transformers (its own
formulas for scaled rope, see ``layers/rotary.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    folder: Path
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_parameters: dict[str, Any]  # always with rope_type and rope_theta
    attention_bias: bool
    tie_word_embeddings: bool = False
    # a GGUF's rope_freqs: llama.cpp's divisor of each inverse frequency (Llama 3's scaling)
    rope_freqs: tuple[float, ...] | None = None
    # transformers' LlamaConfig defaults, for files that leave these out
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    eos_token_id: int | list[int] | None = None
    # the GGUF file whose tensors are read quantized (see loader.prepare_model), else None
    gguf: Path | None = None
    # its quantized products multiply 8-bit activations (--weights gguf-int8)
    int8_activations: bool = False
    # weights read from the folder and quantized at load to Q8_0 (--weights q8_0)
    quantize_q8_0: bool = False
    # Gemma 3: each layer's kind ("sliding_attention" or "full_attention"), the local
    # layers' window and rope, the query scale and the logits' soft cap (empty elsewhere)
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    local_rope_parameters: dict[str, Any] | None = None
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None

    @classmethod
    def from_folder(cls, folder: Path) -> ModelConfig:
        """Raise ValueError naming what is missing or malformed."""
        path = Path(folder) / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"{path}: {error}") from error
        required = ("model_type", "vocab_size", "hidden_size", "intermediate_size",
                    "num_hidden_layers", "num_attention_heads")
        if missing := [key for key in required if key not in raw]:
            raise ValueError(f"{path}: missing {', '.join(missing)}")
        heads = raw["num_attention_heads"]
        optional = {name: raw[name] for name in ("rms_norm_eps", "max_position_embeddings",
                                                  "tie_word_embeddings", "eos_token_id",
                                                  "sliding_window", "query_pre_attn_scalar",
                                                  "final_logit_softcapping",
                                                  "attn_logit_softcapping")
                    if raw.get(name) is not None}
        if raw.get("rope_freqs") is not None:
            optional["rope_freqs"] = tuple(raw["rope_freqs"])
        # transformers 5 writes rope_parameters; older files rope_theta and rope_scaling
        rope = _rope(raw.get("rope_parameters") or raw.get("rope_scaling"),
                     raw.get("rope_theta", 10000.0))
        if raw["model_type"] == "gemma3_text":
            rope, optional["local_rope_parameters"] = _gemma3_rope_parameters(raw)
            optional["layer_types"] = tuple(raw.get("layer_types") or _gemma3_layer_types(raw))
        return cls(
            folder=Path(folder), **{key: raw[key] for key in required},
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads, rope_parameters=rope,
            # Qwen2 has biases on q, k and v without saying so in its config
            attention_bias=bool(raw.get("attention_bias")) or raw["model_type"] == "qwen2",
            **optional)

    @property
    def rope_type(self) -> str:
        return self.rope_parameters["rope_type"]

    @property
    def rope_theta(self) -> float:
        return float(self.rope_parameters["rope_theta"])


def _rope(params: dict[str, Any] | None, theta: float) -> dict[str, Any]:
    """A rope's parameters with its type (older files have it under ``type``) and its theta
    (``theta`` where the parameters leave it out)."""
    rope = dict(params or {})
    if "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type", "default")
    rope.setdefault("rope_theta", theta)
    return rope


def _gemma3_rope_parameters(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The global and the local layers' rope, as transformers' Gemma3TextConfig reads them:
    ``rope_parameters`` keyed by layer type, or the older ``rope_theta``,
    ``rope_local_base_freq`` and ``rope_scaling`` (which scales the global layers only)."""
    params = raw.get("rope_parameters") or {}
    if "full_attention" not in params and "sliding_attention" not in params:
        params = {"full_attention": raw.get("rope_scaling")}
    return (_rope(params.get("full_attention"), raw.get("rope_theta", 1_000_000.0)),
            _rope(params.get("sliding_attention"), raw.get("rope_local_base_freq", 10_000.0)))


def _gemma3_layer_types(raw: dict[str, Any]) -> list[str]:
    """transformers' default: every ``sliding_window_pattern``-th layer is global."""
    pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6
    return ["sliding_attention" if (i + 1) % pattern else "full_attention"
            for i in range(raw["num_hidden_layers"])]
