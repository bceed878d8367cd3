"""EngineConfig: every knob of the engine in one place, each described in API.md."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pagedchat.engine.errors import RequestError
from pagedchat.engine.fits import RequestFit
from pagedchat.engine.presets import SPECULATIVE_TOKENS
from pagedchat.machine import memory_bytes

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(size: str | int) -> int:
    """``"2GiB"`` -> 2147483648; an int is taken as bytes."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(size))
    if not match or match.group(2).upper() not in _UNITS:
        raise RequestError(f"cannot read {size!r} as a memory size (try '2GiB' or '512MB')")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


# the --weights choices that keep a GGUF's tensors quantized, and every choice multiplied
# on quantized blocks (the CPU's kernels only): those and an HF folder quantized at load
QUANTIZED_WEIGHTS = ("gguf", "gguf-int8")
CPU_WEIGHTS = (*QUANTIZED_WEIGHTS, "q8_0")
KV_CACHE_DTYPES = ("auto", "int8")
# the dtypes of weights and activations an engine runs in
DTYPE_NAMES = ("float32", "bfloat16", "float16")


@dataclass
class EngineConfig:
    model: str | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: str | int | None = None
    swap_space: str | int = "1GiB"
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"
    # vLLM's default too: a larger batch makes bigger matrix products, which read the
    # weights once for more tokens
    max_num_seqs: int = 256
    # Activations (and the malloc heap that keeps them) scale with this; a larger budget held more
    # memory at the same speed. A chatbot prompt of the paper's length still fits one step.
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None
    dtype: str = "float32"
    kv_cache_dtype: str = "auto"
    # None: gguf for a GGUF model on the CPU in float32, else dtype (resolve_weights)
    weights: str | None = None
    device: str = "auto"
    attention_backend: str = "auto"
    tensor_parallel_size: int = 1
    speculative: str | None = None
    num_speculative_tokens: int = SPECULATIVE_TOKENS
    ngram_min: int = 1
    ngram_max: int = 8
    kv_store: str | None = None
    kv_store_cap: str | int = "2GiB"

    DEFAULT_KV_CACHE_MEMORY = "2GiB"
    # the least a pool sized for one request holds (see request_kv_blocks): a few blocks
    # more than a short request needs cost little next to the model
    MIN_REQUEST_POOL_TOKENS = 256

    def __post_init__(self) -> None:
        bs = self.block_size
        if bs < 1 or bs > 256 or bs & (bs - 1):
            raise RequestError(f"block_size must be a power of two from 1 to 256, got {bs}")
        for name, allowed, words in (
                ("preemption_mode", ("recompute", "swap"), "'recompute' or 'swap'"),
                ("dtype", DTYPE_NAMES, "float32, bfloat16 or float16"),
                ("kv_cache_dtype", KV_CACHE_DTYPES, "auto or int8"),
                ("weights", (None, *CPU_WEIGHTS, *DTYPE_NAMES),
                 "gguf, gguf-int8, q8_0, float32 or bfloat16"),
                ("attention_backend", ("auto", "torch", "cpu", "triton"),
                 "auto, torch, cpu or triton"),
                ("speculative", (None, "ngram"), "'ngram' or None")):
            if getattr(self, name) not in allowed:
                raise RequestError(f"{name} must be {words}, got {getattr(self, name)!r}")
        for name in ("num_kv_blocks", "tensor_parallel_size", "max_num_seqs",
                     "max_num_batched_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise RequestError(f"{name} must be positive, got {getattr(self, name)}")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise RequestError("num_speculative_tokens must be from 1 to 16, "
                               f"got {self.num_speculative_tokens}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise RequestError(f"ngram_min ({self.ngram_min}) must be from 1 to ngram_max "
                               f"({self.ngram_max})")
        if self.kv_store is not None and self.tensor_parallel_size > 1:
            raise RequestError("a KV store (kv_store) does not combine with tensor "
                               f"parallelism (tensor_parallel_size {self.tensor_parallel_size})")
        if self.kv_store is not None and not self.enable_prefix_caching:
            raise RequestError("a KV store (kv_store) needs the prefix cache "
                               "(enable_prefix_caching is off)")
        parse_bytes(self.kv_store_cap)
        # the pool is allocated whole: more than the machine's memory cannot be
        if self.kv_cache_memory is not None and not (
                0 < parse_bytes(self.kv_cache_memory) <= memory_bytes()):
            raise RequestError(f"kv_cache_memory {self.kv_cache_memory!r} must be above 0 and "
                               f"at most this machine's memory ({memory_bytes():,.0f} bytes)")
        parse_bytes(self.swap_space)

    def request_kv_blocks(self, num_prompt_tokens: int, max_tokens: int,
                          sequences: int = 1, windows: tuple[int | None, ...] = (None,)) -> int:
        """Blocks for a pool that serves one request alone: what the scheduler's rule
        (:meth:`pagedchat.engine.fits.RequestFit.blocks`) says it holds, ``sequences`` being n or
        best_of and ``windows`` the model's layer groups (:func:`.kv_groups.kv_groups`), each
        holding its own blocks; at least ``MIN_REQUEST_POOL_TOKENS`` tokens' worth."""
        fit = RequestFit(self.block_size, windows, self.max_model_len,
                         self.max_num_batched_tokens, self.max_num_seqs)
        return max(fit.blocks(num_prompt_tokens, max_tokens, sequences),
                   len(windows) * -(-self.MIN_REQUEST_POOL_TOKENS // self.block_size))
