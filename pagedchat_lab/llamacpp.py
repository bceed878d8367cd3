"""llama.cpp as a peer, through llama-cpp-python's low-level bindings (the ``[peers]`` extra).

It runs on the GGUF file pagedchat loaded, with pagedchat's thread count, on the same
prompt token ids, greedy (the arg-max of its logits). Two uses:

- single stream (``bench latency``): one sequence in a context, the prompt in one
  ``llama_decode`` call (llama.cpp splits it into its micro-batches), then one token a call.
- batched (``bench throughput``): ``n_seq`` sequences in one context whose KV cells all
  sequences share (``kv_unified``), served as llama.cpp's own server does: every step is one
  ``llama_decode`` of a ``llama_batch`` holding one token of each decoding sequence, then
  prompt tokens of the sequences still in prefill up to the batch size. A request joins when
  a sequence slot is free and the cells its prompt and output need are not promised to
  others, so no decode ever runs out of cells; its slot's cells are freed when it ends.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pagedchat_lab.metrics import RequestResult
from pagedchat_lab.sharegpt import Request

NAME = "llama.cpp"
# sequences per context swept by `bench throughput`; llama.cpp holds at most 256
SEQUENCES = (16, 64, 256)
MAX_SEQUENCES = 256
# llama.cpp's own defaults: tokens per llama_decode call and per micro-batch
BATCH_TOKENS, MICRO_BATCH_TOKENS = 2048, 512
INSTALL = "pip install 'pagedchat[peers]' (it builds llama-cpp-python with the system compiler)"
Advance = Callable[[int], None]


def bindings():
    """The ``llama_cpp`` module, or a ValueError that says how to install it."""
    try:
        import llama_cpp
    except ImportError as error:
        raise ValueError(f"the llama.cpp peer needs llama-cpp-python: {INSTALL}") from error
    return llama_cpp


def gguf_of(source: str) -> Path:
    """The GGUF file a model was loaded from; llama.cpp reads nothing else."""
    path = Path(source)
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise ValueError(f"llama.cpp runs on a GGUF file, and this model is {source} "
                         "(pass --model FILE.gguf)")
    return path


def _silence(lib) -> None:
    """Drop llama.cpp's log lines (model and context details on every load)."""
    global _QUIET
    if _QUIET is None:
        _QUIET = lib.llama_log_callback(lambda level, text, data: None)
        lib.llama_log_set(_QUIET, ctypes.c_void_p(0))


_QUIET = None  # the callback must outlive every call into llama.cpp


class _Batch:
    """A ``llama_batch`` whose arrays are numpy arrays this object owns (no per-token
    ctypes calls), each token in exactly one sequence."""

    def __init__(self, lib, capacity: int) -> None:
        self.tokens = np.zeros(capacity, np.int32)
        self.positions = np.zeros(capacity, np.int32)
        self.counts = np.ones(capacity, np.int32)
        self.seqs = np.zeros((capacity, 1), np.int32)
        self.wanted = np.zeros(capacity, np.int8)
        rows = (ctypes.POINTER(ctypes.c_int32) * capacity)(*[
            self.seqs[i].ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
            for i in range(capacity)])
        self._rows = rows
        self.native = lib.llama_batch()
        self.native.embd = None
        for name, array in (("token", self.tokens), ("pos", self.positions),
                            ("n_seq_id", self.counts), ("logits", self.wanted)):
            setattr(self.native, name, array.ctypes.data_as(
                type(getattr(self.native, name))))
        self.native.seq_id = ctypes.cast(rows, type(self.native.seq_id))
        self.size = 0

    def add(self, tokens: Sequence[int], start: int, seq: int, want_last: bool) -> None:
        n, end = len(tokens), self.size + len(tokens)
        self.tokens[self.size:end] = tokens
        self.positions[self.size:end] = np.arange(start, start + n)
        self.seqs[self.size:end, 0] = seq
        self.wanted[self.size:end] = 0
        self.wanted[end - 1] = want_last
        self.size = end


class LlamaCpp:
    """One GGUF loaded by llama.cpp, with at most one context at a time (a context's
    sequence count is fixed when it is made; its KV cells are allocated and cleared then,
    outside any timing)."""

    def __init__(self, path: Path, threads: int | None = None) -> None:
        self.lib = lib = bindings()
        _silence(lib)
        lib.llama_backend_init()
        self.threads = threads or torch.get_num_threads()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        self.model = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise ValueError(f"{path}: llama.cpp could not load this GGUF")
        self.vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))
        self.ctx = None
        self.shape: tuple[int, int] | None = None

    def context(self, n_seq: int, n_ctx: int):
        """A context for ``n_seq`` sequences sharing ``n_ctx`` KV cells, emptied."""
        lib = self.lib
        if self.shape != (n_seq, n_ctx):
            self.close_context()
            params = lib.llama_context_default_params()
            params.n_ctx, params.n_seq_max, params.kv_unified = n_ctx, n_seq, True
            params.n_batch, params.n_ubatch = BATCH_TOKENS, MICRO_BATCH_TOKENS
            params.n_threads = params.n_threads_batch = self.threads
            params.no_perf = True
            self.ctx = lib.llama_init_from_model(self.model, params)
            if not self.ctx:
                raise ValueError(f"llama.cpp could not make a context of {n_ctx} tokens for "
                                 f"{n_seq} sequences")
            self.shape = (n_seq, n_ctx)
        lib.llama_memory_clear(lib.llama_get_memory(self.ctx), True)
        return self.ctx

    def build(self) -> dict[str, str]:
        """The bindings' version and what the llama.cpp build uses of this CPU."""
        from importlib.metadata import version

        return {"llama_cpp_python": version("llama-cpp-python"),
                "system_info": self.lib.llama_print_system_info().decode().strip()}

    def close_context(self) -> None:
        if self.ctx is not None:
            self.lib.llama_free(self.ctx)
            self.ctx, self.shape = None, None

    def decode(self, batch: _Batch, outputs: int) -> np.ndarray:
        """Run ``batch``; the arg-max token of each row it asked logits for, in order."""
        batch.native.n_tokens = batch.size
        status = self.lib.llama_decode(self.ctx, batch.native)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status} on {batch.size} tokens")
        logits = np.ctypeslib.as_array(self.lib.llama_get_logits(self.ctx),
                                       shape=(outputs, self.vocab))
        batch.size = 0
        return logits.argmax(axis=1)

    def greedy(self, prompt_ids: list[int], max_tokens: int,
               ) -> tuple[list[int], list[float], float]:
        """One sequence alone: its greedy tokens, the time each became known and the time
        the prompt went in (after the context was made and emptied)."""
        self.context(1, _round_up(max(len(prompt_ids) + max_tokens, 2048), 256))
        batch = _Batch(self.lib, max(len(prompt_ids), 1))
        tokens, times = [], []
        start = time.perf_counter()
        batch.add(prompt_ids, 0, 0, True)
        for step in range(max_tokens):
            tokens.append(int(self.decode(batch, 1)[0]))
            times.append(time.perf_counter())
            batch.add(tokens[-1:], len(prompt_ids) + step, 0, True)
        return tokens, times, start

    def __call__(self, prompt_ids: list[int], max_tokens: int) -> dict[str, float]:
        """One sequence alone: time to first token and decode tokens/s after it (timed as
        pagedchat's are)."""
        _, times, start = self.greedy(prompt_ids, max_tokens)
        decode = times[-1] - times[0]
        return {"ttft_ms": (times[0] - start) * 1000,
                "decode_tokens_per_s": (max_tokens - 1) / decode if decode else float("nan")}


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


@dataclass
class _Slot:
    """A request in a sequence slot: its next prompt token and the tokens it made."""

    index: int
    seq: int
    request: Request
    fed: int = 0
    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    @property
    def prefilling(self) -> bool:
        return self.fed < self.request.prompt_len

    @property
    def position(self) -> int:
        return self.request.prompt_len + len(self.times) - 1


class LlamaCppBatched:
    """llama.cpp's batched decoding with ``n_seq`` sequences over ``kv_tokens`` cells."""

    name = NAME

    def __init__(self, llama: LlamaCpp, n_seq: int, kv_tokens: int) -> None:
        self.llama = llama
        self.n_seq = n_seq
        self.kv_tokens = kv_tokens  # promised exactly; llama.cpp may pad its context
        self.label = f"llama.cpp-s{n_seq}"
        self.setting = {"sequences": n_seq}
        self.outputs: list[list[int]] = []  # the last run's tokens, per request

    def reset(self) -> None:
        """Each run empties the context's cells."""

    def run(self, requests: list[Request], arrivals: list[float],
            advance: Advance) -> list[RequestResult]:
        """Serve ``requests`` arriving at ``arrivals`` (seconds from now, ascending)."""
        too_long = [r for r in requests if r.prompt_len + r.output_len > self.kv_tokens]
        if too_long:
            raise ValueError(f"a request of {too_long[0].prompt_len} + {too_long[0].output_len}"
                             f" tokens does not fit llama.cpp's {self.kv_tokens} KV cells")
        self.llama.context(self.n_seq, self.kv_tokens)
        lib, llama = self.llama.lib, self.llama
        memory = lib.llama_get_memory(llama.ctx)
        batch = _Batch(lib, BATCH_TOKENS)
        free_seqs = list(range(self.n_seq))
        running: list[_Slot] = []
        results: dict[int, RequestResult] = {}
        self.outputs = [[] for _ in requests]
        promised = added = 0
        start = time.perf_counter()
        while len(results) < len(requests):
            now = time.perf_counter()
            while (added < len(requests) and free_seqs and start + arrivals[added] <= now
                   and promised + requests[added].prompt_len + requests[added].output_len
                   <= self.kv_tokens):
                r = requests[added]
                promised += r.prompt_len + r.output_len
                running.append(_Slot(added, free_seqs.pop(), r))
                added += 1
            if not running:
                time.sleep(max(start + arrivals[added] - time.perf_counter(), 0.0))
                continue
            stepped = [s for s in running if not s.prefilling]
            for s in stepped:
                batch.add(s.tokens[-1:], s.position, s.seq, True)
            for s in running:
                room = BATCH_TOKENS - batch.size
                if s.prefilling and room > 0:
                    chunk = s.request.prompt_ids[s.fed:s.fed + room]
                    ends = s.fed + len(chunk) == s.request.prompt_len
                    batch.add(chunk, s.fed, s.seq, ends)
                    s.fed += len(chunk)
                    if ends:
                        stepped.append(s)
            if not stepped:  # a prompt chunk alone, its logits not needed
                llama.decode(batch, 0)
                continue
            tokens = llama.decode(batch, len(stepped))
            now = time.perf_counter()
            for s, token in zip(stepped, tokens):
                s.tokens.append(int(token))
                s.times.append(now)
                if len(s.times) == s.request.output_len:
                    results[s.index] = RequestResult(s.request.prompt_len,
                                                     start + arrivals[s.index], s.times)
                    self.outputs[s.index] = s.tokens
                    lib.llama_memory_seq_rm(memory, s.seq, -1, -1)
                    free_seqs.append(s.seq)
                    promised -= s.request.prompt_len + s.request.output_len
                    running.remove(s)
                    advance(1)
        return [results[i] for i in range(len(requests))]


def batched_peers(engine, sequences: Sequence[int] = SEQUENCES) -> list[LlamaCppBatched]:
    """One batched peer per sequence count, on the engine's GGUF and KV pool (in tokens)."""
    for n in sequences:
        if not 1 <= n <= MAX_SEQUENCES:
            raise ValueError(f"llama.cpp holds 1 to {MAX_SEQUENCES} sequences, not {n}")
    llama = LlamaCpp(gguf_of(engine.model_files.source))
    cfg = engine.config
    return [LlamaCppBatched(llama, n, cfg.num_kv_blocks * cfg.block_size) for n in sequences]


def check_tokens(engine, llama: LlamaCpp, count: int = 4, max_tokens: int = 32,
                 seed: int = 0) -> dict[str, float]:
    """How far llama.cpp's greedy tokens follow pagedchat's on ``count`` ShareGPT prompts.
    Agreement, not identity: llama.cpp multiplies 8-bit-quantized activations and keeps a
    float16 KV cache, pagedchat multiplies the de-quantized weights in its own dtype."""
    from pagedchat import console
    from pagedchat.engine.sampling_params import SamplingParams
    from pagedchat_lab.quality import shared_prefix_len
    from pagedchat_lab.sharegpt import sample_requests

    prompts = [r.prompt_ids for r in sample_requests(
        engine.tokenizer, count, seed, max_tokens,
        max_total_len=min(1024, engine.config.max_model_len))]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(f"llama.cpp-check-{i}", ids, params)
    ours: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                ours[out.request_id] = out.outputs[0].token_ids
    shared = [shared_prefix_len(ours[f"llama.cpp-check-{i}"], llama.greedy(ids, max_tokens)[0])
              for i, ids in enumerate(prompts)]
    found = {"prompts": len(prompts), "tokens": max_tokens,
             "first_token_agreement": sum(s > 0 for s in shared) / len(prompts),
             "mean_shared_prefix_tokens": sum(shared) / len(prompts),
             "identical": sum(s == max_tokens for s in shared)}
    console.note(f"llama.cpp greedy vs pagedchat on {len(prompts)} ShareGPT prompts: first "
                 f"token {sum(s > 0 for s in shared)}/{len(prompts)}, identical "
                 f"{found['identical']}/{len(prompts)}, mean shared prefix "
                 f"{found['mean_shared_prefix_tokens']:.1f} of {max_tokens} tokens")
    return found
