"""pagedchat driven through a request trace, the way the peers in peers.py are."""

from __future__ import annotations

import time
from collections.abc import Callable

from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.outputs import EngineStats
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat_lab.metrics import RequestResult
from pagedchat_lab.sharegpt import Request

Advance = Callable[[int], None]
OnStep = Callable[[EngineStats], None]


class PagedChat:
    """One engine, fed in arrival order, greedy with ``ignore_eos`` so every request makes
    exactly its trace's output length. The engine keeps time with ``time.time``."""

    def __init__(self, engine: LLMEngine, on_step: OnStep | None = None,
                 name: str = "pagedchat") -> None:
        self.engine = engine
        self.on_step = on_step  # called with a stats snapshot after every step
        self.name = self.label = name  # "pagedchat-float32": pagedchat as a peer of itself
        self.setting: dict[str, object] = {}

    def reset(self) -> None:
        """Start the next run cold: no prefix cached from this one."""
        self.engine.reset_prefix_cache()

    def run(self, requests: list[Request], arrivals: list[float],
            advance: Advance) -> list[RequestResult]:
        """Serve ``requests`` arriving at ``arrivals`` (seconds from now, ascending)."""
        engine = self.engine
        start = time.time()
        results: dict[int, RequestResult] = {}
        added = 0
        while len(results) < len(requests):
            now = time.time()
            while added < len(requests) and start + arrivals[added] <= now:
                r = requests[added]
                params = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)
                engine.add_request(f"bench-{added}", r.prompt_ids, params,
                                   arrival_time=start + arrivals[added])
                added += 1
            if not engine.has_unfinished_requests():
                time.sleep(max(start + arrivals[added] - time.time(), 0.0))
                continue
            for out in engine.step():
                if out.finished:
                    index = int(out.request_id.removeprefix("bench-"))
                    results[index] = RequestResult(
                        len(out.prompt_token_ids), out.metrics.arrival_time,
                        list(out.metrics.token_times), out.num_cached_tokens)
                    advance(1)
            if self.on_step is not None:
                self.on_step(engine.stats())
        return [results[i] for i in range(len(requests))]
