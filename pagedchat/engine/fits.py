"""Whether a request fits the engine: the one rule ``add_request`` refuses requests by
(``LLMEngine.request_fit``, the scheduler's), the server answers 413 by and sizes a default
``max_tokens`` with, and a pool for one request is sized by (``EngineConfig.request_kv_blocks``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedchat.engine import kv_groups
from pagedchat.engine.errors import RequestError

if TYPE_CHECKING:
    from pagedchat.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class RequestFit:
    block_size: int
    windows: tuple[int | None, ...]  # per layer group: its sliding window, None for global
    max_model_len: int | None  # the context; None: not yet resolved
    chunk: int  # tokens computed per step at most (max_num_batched_tokens)
    max_num_seqs: int
    num_blocks: int = 0  # the KV pool, once there is one

    def blocks(self, num_prompt_tokens: int, max_tokens: int, sequences: int = 1) -> int:
        """The most blocks a request holds at once: each of its ``sequences`` up to prompt +
        ``max_tokens`` tokens, or the context where that is less, counted unshared (a group
        preempted by recompute prefills each sequence on its own)."""
        tokens = num_prompt_tokens + max_tokens
        if self.max_model_len is not None:
            tokens = min(tokens, self.max_model_len)
        return sequences * kv_groups.max_blocks(self.windows, self.block_size, tokens, self.chunk)

    def longest(self, sequences: int) -> int:
        """The most tokens (prompt and reply) each of ``sequences`` sequences may reach with
        all of them in the pool, at most the context; 0 when not one token fits."""
        low, high = 0, self.max_model_len
        while low < high:  # blocks() grows with the tokens
            middle = (low + high + 1) // 2
            if self.blocks(middle, 0, sequences) <= self.num_blocks:
                low = middle
            else:
                high = middle - 1
        return low

    def check(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Raise RequestError for a request that could never be scheduled: more sequences
        than run at once, or more blocks than the whole pool holds."""
        if params.best_of > self.max_num_seqs:
            raise RequestError(
                f"the request runs {params.best_of} sequences (n/best_of) but the engine runs at "
                f"most max_num_seqs={self.max_num_seqs} at once", "n")
        need = self.blocks(num_prompt_tokens, params.max_tokens, params.best_of)
        if need > self.num_blocks:
            total = min(num_prompt_tokens + params.max_tokens, self.max_model_len)
            raise RequestError(
                f"the request needs up to {need} KV blocks ({num_prompt_tokens} prompt tokens + "
                f"{total - num_prompt_tokens} new, x{params.best_of} sequences, block size "
                f"{self.block_size}) but the whole pool has {self.num_blocks}; lower max_tokens "
                "or give the cache more memory", "max_tokens")
