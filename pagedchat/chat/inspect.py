"""The scenario behind ``pagedchat inspect``: requests run step by step, the engine's memory
after each. The default one shows each kind of sharing: two chats with the same system prompt
(the second finds the first's prompt blocks in the prefix cache), one request with n = 3
samples (sharing the prompt's blocks, copy-on-write), and one beam search of width 2 (its
beams share their common history; a pruned beam frees its blocks at once)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from pagedchat.chat.prompt import render
from pagedchat.engine.errors import RequestError
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.outputs import EngineStats
from pagedchat.engine.sampling_params import SamplingParams

SYSTEM_PROMPT = ("You are a patient teacher of computer systems. Answer in two or three short "
                 "sentences, with one concrete example, and never use jargon without saying "
                 "what it means.")


@dataclass
class Arrival:
    step: int  # the engine step before which the request is added
    request_id: str
    prompt: str | list[int]
    params: SamplingParams


@dataclass
class Snapshot:
    step: int
    events: list[str]
    stats: EngineStats

    def to_json(self) -> dict[str, object]:
        return {"step": self.step, "events": self.events, "stats": dataclasses.asdict(self.stats)}


def default_scenario(tokenizer, max_tokens: int) -> list[Arrival]:
    def chat(question: str) -> list[int]:
        return render(tokenizer, [{"role": "system", "content": SYSTEM_PROMPT},
                                  {"role": "user", "content": question}])

    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return [
        Arrival(0, "chat-1", chat("What is a page table?"), greedy),
        Arrival(2, "chat-2", chat("Why does a GPU like large batches?"), greedy),
        Arrival(4, "samples-n3", chat("Give a name for a cat that loves memory."),
                SamplingParams(n=3, temperature=0.9, seed=0, max_tokens=max_tokens)),
        Arrival(6, "beam-2", chat("Say hello in French."),
                SamplingParams(n=2, use_beam_search=True, temperature=0.0,
                               max_tokens=max_tokens))]


def prompt_scenario(prompts: list[str], max_tokens: int) -> list[Arrival]:
    """The user's own prompts, all at the first step, greedy."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return [Arrival(0, f"prompt-{i}", text, params) for i, text in enumerate(prompts, 1)]


# what a snapshot reports when it grew since the last one
_CHANGES = (("preemptions", "preempted: {} (pool full)"),
            ("swapped_out", "{} blocks swapped out to CPU"),
            ("swapped_in", "{} blocks swapped back in"),
            ("window_freed_blocks", "{} local blocks slid out of the window, back to the pool"))


def run_scenario(engine: LLMEngine, arrivals: list[Arrival],
                 show: Callable[[Snapshot], bool], max_steps: int = 500) -> list[Snapshot]:
    """Step the engine, adding each arrival at its step; after every step build a snapshot
    and pass it to ``show`` (which returns False to stop early)."""
    snapshots: list[Snapshot] = []
    pending = sorted(arrivals, key=lambda a: a.step)
    before = engine.stats()
    for step in range(1, max_steps + 1):
        events = []
        while pending and pending[0].step < step:
            arrival = pending.pop(0)
            try:
                engine.add_request(arrival.request_id, arrival.prompt, arrival.params)
                events.append(f"{arrival.request_id} arrives")
            except RequestError as error:
                events.append(f"{arrival.request_id} refused: {error}")
        for out in engine.step():
            if out.finished:
                reasons = ",".join(sorted({str(c.finish_reason) for c in out.outputs}))
                events.append(f"{out.request_id} finished ({reasons}, "
                              f"{out.num_cached_tokens} prompt tokens from the cache)")
        stats = engine.stats()
        grown = [(getattr(stats, name) - getattr(before, name), text) for name, text in _CHANGES]
        events += [text.format(count) for count, text in grown if count > 0]
        before = stats
        snapshot = Snapshot(step, events, stats)
        snapshots.append(snapshot)
        if not show(snapshot) or not (pending or engine.has_unfinished_requests()):
            break
    return snapshots
