"""transformers as a peer of pagedchat, on the same weights, in the same process.

- ``hf-generate``: transformers ``generate`` with static batching. Requests are taken in
  trace order, ``batch_size`` at a time, prompts left-padded to the longest. A batch runs
  until its longest request is done (``min_new_tokens = max_new_tokens``, so EOS cannot stop
  it early: the ``ignore_eos`` of the other engines). A request's own output ends at its own
  length: only those tokens are counted, and its latency ends at its own last token (as if
  streamed), which is the kindest reading for static batching. Online, it acts as a server
  that, whenever idle, takes up to ``batch_size`` waiting requests and runs them to the end.
- ``hf-continuous``: transformers' own continuous batching (paged KV cache), one request
  per trace entry with that entry's own ``max_new_tokens`` and ``eos_token_id=-1``
  (ignore_eos). Its cache is sized explicitly to pagedchat's KV pool in tokens (on a CPU it
  would otherwise take most of the free memory). Online, requests are added from this thread at
  their arrival times while its own thread generates.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pagedchat.engine.loading.loader import ModelFiles, prepare_model
from pagedchat_lab.metrics import RequestResult
from pagedchat_lab.sharegpt import Request

Advance = Callable[[int], None]


def weights_folder(files: ModelFiles) -> Path:
    """A folder with weights transformers loads (the peers'): for a GGUF read quantized,
    its de-quantized conversion, made once and cached."""
    return files.folder if files.gguf is None else prepare_model(files.gguf).folder


def load_hf_model(folder: Path, dtype: str = "float32"):
    """The transformers model of an HF folder (as ``prepare_model`` returns), for inference."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    return model.eval()


def _wait_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


class _StepClock:
    """A stopping criterion that never stops: it notes when each decoding step ends."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


class HFGenerate:
    """transformers ``generate``, static batches of ``batch_size`` requests."""

    name = "hf-generate"

    def __init__(self, model, pad_token_id: int, batch_size: int = 8) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        self.label = f"hf-generate-b{batch_size}"
        self.setting = {"batch_size": batch_size}

    def reset(self) -> None:
        """Nothing carries over from one run to the next."""

    @torch.inference_mode()
    def _generate(self, batch: list[Request]) -> list[float]:
        from transformers import StoppingCriteriaList

        width = max(r.prompt_len for r in batch)
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, r in enumerate(batch):
            ids[row, width - r.prompt_len:] = torch.tensor(r.prompt_ids)
            mask[row, width - r.prompt_len:] = 1
        new = max(r.output_len for r in batch)
        clock = _StepClock()
        self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                            min_new_tokens=new, do_sample=False, pad_token_id=self.pad_token_id,
                            stopping_criteria=StoppingCriteriaList([clock]))
        return clock.times

    def run(self, requests: list[Request], arrivals: list[float],
            advance: Advance) -> list[RequestResult]:
        """Serve ``requests`` arriving at ``arrivals`` (seconds from now, ascending)."""
        start = time.perf_counter()
        results: list[RequestResult] = []
        while len(results) < len(requests):
            first = len(results)
            _wait_until(start + arrivals[first])
            now = time.perf_counter() - start
            last = first + 1
            while (last < len(requests) and last - first < self.batch_size
                   and arrivals[last] <= now):
                last += 1
            batch = requests[first:last]
            times = self._generate(batch)
            for i, r in enumerate(batch, first):
                results.append(RequestResult(r.prompt_len, start + arrivals[i],
                                             times[:r.output_len]))
            advance(len(batch))
        return results


class HFContinuous:
    """transformers continuous batching (``init_continuous_batching``)."""

    name = "hf-continuous"

    def __init__(self, model, kv_tokens: int, max_batch_tokens: int, max_num_seqs: int,
                 page_size: int = 256) -> None:
        self.model = model
        self.kv_tokens = kv_tokens
        self.max_batch_tokens = max_batch_tokens
        self.max_num_seqs = max_num_seqs
        self.page_size = page_size
        self.label = f"hf-continuous-r{max_num_seqs}"
        self.setting = {"max_requests": max_num_seqs}

    def reset(self) -> None:
        """Each run makes its own cache."""

    def _configs(self, max_new_tokens: int):
        from transformers import ContinuousBatchingConfig, GenerationConfig

        generation = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                                      eos_token_id=-1)
        # The cache is sized here, as pagedchat's pool; max_memory_percent=1 leaves transformers'
        # guard only the memory not yet resident: its default share of the NUMA node refused
        # a cache of pagedchat's size.
        batching = ContinuousBatchingConfig(
            page_size=self.page_size, num_blocks=math.ceil(self.kv_tokens / self.page_size),
            max_batch_tokens=self.max_batch_tokens, max_requests_per_batch=self.max_num_seqs,
            max_memory_percent=1.0)
        return generation, batching

    def run(self, requests: list[Request], arrivals: list[float],
            advance: Advance) -> list[RequestResult]:
        """Serve ``requests`` arriving at ``arrivals`` (seconds from now, ascending)."""
        generation, batching = self._configs(max(r.output_len for r in requests))
        found: dict[str, object] = {}
        with self.model.continuous_batching_context_manager(
                generation_config=generation, continuous_batching_config=batching,
                block=True, timeout=5) as manager:
            start = time.perf_counter()
            arrived = [start + a for a in arrivals]
            added = 0
            while len(found) < len(requests):
                while added < len(requests) and arrived[added] <= time.perf_counter():
                    r = requests[added]
                    manager.add_request(r.prompt_ids, request_id=str(added),
                                        max_new_tokens=r.output_len, record_timestamps=True,
                                        eos_token_id=-1)
                    added += 1
                wait = arrived[added] - time.perf_counter() if added < len(requests) else 1.0
                result = manager.get_result(timeout=max(wait, 0.001))
                if result is None:
                    if not manager.is_running():
                        raise RuntimeError("transformers continuous batching stopped early")
                    continue
                if result.error is not None:
                    raise RuntimeError(f"transformers continuous batching: {result.error}")
                if result.is_finished():
                    found[result.request_id] = result
                    advance(1)
        return [RequestResult(r.prompt_len, arrived[i], list(found[str(i)].timestamps))
                for i, r in enumerate(requests)]
