"""A stand-in for ``LLMEngine`` with the members ``EngineDriver`` uses, for UI tests.

Every request is answered with the same fixed text, one token per step, so a reply is
known before it streams; a test can hold the steps and let them go one by one. Each
running request holds the blocks its tokens fill in a pool of ``num_kv_blocks``, so the
inspector and the status line see blocks come and go as they would with the real engine;
a request waits while the pool has no block for its next token.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from pagedchat.engine.outputs import (
    BlockEntry,
    CompletionOutput,
    EngineStats,
    RequestOutput,
    SeqBlockTable,
)
from pagedchat.engine.sampling_params import SamplingParams

REPLY = "Paged attention keeps each sequence's cache in fixed-size blocks. "


@dataclass(frozen=True)
class FakeConfig:
    num_kv_blocks: int
    block_size: int


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


class FakeEngine:
    """Answers every request with ``reply`` (its end is the reply's end, unless the request
    ignores EOS: then the text repeats until ``max_tokens``).

    After ``hold()`` a step runs only when ``allow(n)`` grants it; meanwhile ``step``
    returns nothing after a short wait, so the driver still takes commands (cancel, stop)."""

    def __init__(self, tokenizer, reply: str = REPLY, num_kv_blocks: int = 64,
                 block_size: int = 16) -> None:
        self.tokenizer = tokenizer
        self.config = FakeConfig(num_kv_blocks, block_size)
        self.reply_ids: list[int] = []
        self.answer_with(reply)
        self._budget: int | None = None  # steps allowed; None: no limit
        self._granted = threading.Condition()
        self.is_shut_down = False
        self._requests: dict[str, _Request] = {}
        self._free = list(range(num_kv_blocks))

    def answer_with(self, reply: str) -> None:
        self.reply_ids = self.tokenizer.encode(reply, add_special_tokens=False)

    def hold(self) -> None:
        with self._granted:
            self._budget = 0

    def allow(self, steps: int | None = None) -> None:
        """Let ``steps`` more steps run (None: every step from now on)."""
        with self._granted:
            self._budget = None if steps is None else (self._budget or 0) + steps
            self._granted.notify_all()

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams) -> None:
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        need = -(-(len(prompt_token_ids) + params.max_tokens) // self.config.block_size)
        if need > self.config.num_kv_blocks:
            raise ValueError(f"the request needs up to {need} KV blocks but the whole pool has "
                             f"{self.config.num_kv_blocks}")
        self._requests[request_id] = _Request(list(prompt_token_ids), params)

    def abort_request(self, request_id: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is not None:
            self._release(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def step(self) -> list[RequestOutput]:
        with self._granted:
            if not self._granted.wait_for(lambda: self._budget != 0, timeout=0.05):
                return []
            if self._budget is not None:
                self._budget -= 1
        outputs = []
        for rid, request in list(self._requests.items()):
            if not self._grow(request):
                continue
            request.output_ids.append(self.reply_ids[len(request.output_ids)
                                                     % len(self.reply_ids)])
            reason = self._finish_reason(request)
            if reason is not None:
                del self._requests[rid]
                self._release(request)
            completion = CompletionOutput(0, self._text(len(request.output_ids)),
                                          list(request.output_ids), 0.0, reason)
            outputs.append(RequestOutput(rid, None, request.prompt_ids, [completion],
                                         finished=reason is not None))
        return outputs

    def stats(self) -> EngineStats:
        size, total = self.config.block_size, self.config.num_kv_blocks
        tables, owners, pool = [], {}, ["free"] * total
        live = 0
        for rid, request in self._requests.items():
            entries = []
            for logical, physical in enumerate(request.blocks):
                filled = min(size, request.num_tokens - logical * size)
                entries.append(BlockEntry(logical, physical, filled, 1, False, False))
                owners[physical] = [rid]
                pool[physical] = "used"
                live += filled
            tables.append(SeqBlockTable(rid, 0, entries))
        used = total - len(self._free)
        allocated = used * size
        return EngineStats(
            total_blocks=total, block_size=size, used_blocks=used, free_blocks=len(self._free),
            cached_blocks=0, live_tokens=live, empty_slots=allocated - live,
            utilization=live / allocated if allocated else 0.0,
            internal_fragmentation=(allocated - live) / allocated if allocated else 0.0,
            shared_blocks=0, saved_blocks=0, prefix_queries=0, prefix_hits=0,
            prefix_hit_rate=0.0, preemptions=0, swapped_out=0, swapped_in=0,
            host_blocks_used=0,
            num_running=sum(1 for r in self._requests.values() if r.blocks),
            num_waiting=sum(1 for r in self._requests.values() if not r.blocks),
            num_swapped=0, block_tables=tables, pool=pool, owners=owners,
        )

    def shutdown(self) -> None:
        self.is_shut_down = True

    def _text(self, count: int) -> str:
        """The text of the first ``count`` reply tokens (whole replies, then a part)."""
        rounds, rest = divmod(count, len(self.reply_ids))
        decode = self.tokenizer.decode
        return decode(self.reply_ids) * rounds + decode(self.reply_ids[:rest])

    def _grow(self, request: _Request) -> bool:
        """Give ``request`` the blocks its next token needs; False while the pool is short."""
        need = -(-(request.num_tokens + 1) // self.config.block_size) - len(request.blocks)
        if need > len(self._free):
            return False
        request.blocks += [self._free.pop(0) for _ in range(need)]
        return True

    def _release(self, request: _Request) -> None:
        self._free = sorted(self._free + request.blocks)
        request.blocks = []

    def _finish_reason(self, request: _Request) -> str | None:
        if len(request.output_ids) >= request.params.max_tokens:
            return "length"
        if not request.params.ignore_eos and len(request.output_ids) == len(self.reply_ids):
            return "stop"
        return None
