"""The one thread that owns the (single-threaded) LLMEngine.

A UI queues ``Submit`` and ``Cancel``; events come back through a callback on the driver thread,
where the model loads too (a UI starts at once, its first message queued). Outputs are coalesced
per request and handed over every ``flush_interval`` seconds at most (a finished one at once)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pagedchat.chat.prompt import PLAIN_STOP, PromptTooLong, build_prompt, has_chat_template
from pagedchat.chat.repetition import repeating
from pagedchat.engine.engine_thread import STOP, EngineThread

if TYPE_CHECKING:
    from pagedchat.engine.llm_engine import LLMEngine
    from pagedchat.engine.outputs import EngineStats
    from pagedchat.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Submit:
    request_id: str
    system_prompt: str
    messages: list[dict[str, str]]  # oldest first; the last one is answered
    params: SamplingParams
    context_window: int
    raw: bool = False  # plain continuation of the messages' text (see chat/prompt.py)
    loop_guard: bool = True  # stop the reply once it repeats itself (chat/repetition.py)
    continue_reply: bool = False  # the last message is a reply cut short: go on with it


@dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclass(frozen=True)
class SwitchModel:
    """Drop the engine (its live requests aborted) and load the one ``load`` makes; the
    commands queued after this one go to the new engine."""

    load: Callable[[], LLMEngine]


@dataclass(frozen=True)
class EngineReady:
    num_blocks: int
    block_size: int
    chat_template: bool = True  # False: a base model, chatting in the plain format


@dataclass(frozen=True)
class EngineFailed:
    error: str


@dataclass(frozen=True)
class PromptReady:
    request_id: str
    prompt_tokens: int
    dropped_messages: int
    truncated: bool


LOOPED = "looped"  # a ReplyUpdate's finish reason when the repetition guard stopped it


@dataclass(frozen=True)
class ReplyUpdate:
    request_id: str
    text: str  # the whole reply so far
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    draft_tokens: int = 0  # speculative decoding: tokens proposed, and of them accepted
    accepted_tokens: int = 0


@dataclass(frozen=True)
class RequestFailed:
    request_id: str
    error: str


@dataclass(frozen=True)
class StatsUpdate:
    stats: EngineStats
    tokens_per_second: float


Event = EngineReady | EngineFailed | PromptReady | ReplyUpdate | RequestFailed | StatsUpdate


def load_engine(model: str | None = None, **config: Any) -> LLMEngine:
    """An engine for ``model`` (None: the default model); imported here to keep start-up fast."""
    from pagedchat.engine.config import EngineConfig
    from pagedchat.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=model, **config))


class EngineDriver(EngineThread):
    def __init__(self, load: Callable[[], LLMEngine], on_event: Callable[[Event], None],
                 flush_interval: float = 0.05, stats_interval: float = 1.0) -> None:
        super().__init__("engine-driver")
        self._load, self._emit = load, on_event
        self._flush_interval, self._stats_interval = flush_interval, stats_interval
        self._pending: dict[str, ReplyUpdate] = {}
        self._live: set[str] = set()
        self._guarded: set[str] = set()  # live requests the repetition guard watches
        self._token_counts: dict[str, int] = {}
        self._new_tokens = 0
        self._last_flush = self._last_stats = time.monotonic()
        self._stats_dirty = True
        self._stats_due = False  # a snapshot is wanted at the next flush, whatever the time

    def start(self) -> None:
        self._thread.start()

    def submit(self, command: Submit) -> None:
        self._commands.put(command)

    def cancel(self, request_id: str) -> None:
        self._commands.put(Cancel(request_id))

    def switch(self, load: Callable[[], LLMEngine]) -> None:
        """Load another model in the driver thread; ``EngineReady`` or ``EngineFailed`` follows."""
        self._commands.put(SwitchModel(load))

    def _run(self) -> None:
        load: Callable[[], LLMEngine] | None = self._load
        while load is not None:
            try:
                engine = load()
            except Exception as error:  # any load failure is reported, never raised
                reason = str(error) or type(error).__name__
                self._emit(EngineFailed(reason))
                load = self._refuse_all(f"the model failed to load: {reason}")
                continue
            config = engine.config
            self._emit(EngineReady(config.num_kv_blocks, config.block_size,
                                   has_chat_template(engine.tokenizer)))
            self._emit(StatsUpdate(engine.stats(), 0.0))
            ended = self._serve(engine)
            load = ended.load if isinstance(ended, SwitchModel) else None
            del engine  # the old model's memory goes before the next one loads

    def _refuse_all(self, reason: str) -> Callable[[], LLMEngine] | None:
        """Fail every request until a model switch (its loader is returned) or the end."""
        while (command := self._next()) is not STOP:
            if isinstance(command, SwitchModel):
                return command.load
            if isinstance(command, Submit):
                self._emit(RequestFailed(command.request_id, reason))
        return None

    def _next(self) -> object:
        return self._backlog.pop(0) if self._backlog else self._commands.get()

    def _ends(self, command: object) -> bool:
        return isinstance(command, SwitchModel)

    def _handle(self, engine: LLMEngine, command: Submit | Cancel) -> None:
        if isinstance(command, Submit):
            self._add(engine, command)
        else:
            self._abort(engine, command.request_id)

    def _after_step(self, engine: LLMEngine) -> None:
        self._flush(engine, force=not engine.has_unfinished_requests())

    def _on_stop(self, engine: LLMEngine, command: object) -> None:
        for rid in list(self._live):  # leave the engine with its pool balanced
            self._abort(engine, rid)
            if command is not STOP:
                self._emit(RequestFailed(rid, "the model was switched"))
        engine.shutdown()  # tensor-parallel workers end with the app

    def _add(self, engine: LLMEngine, command: Submit) -> None:
        rid = command.request_id
        try:
            prompt = build_prompt(engine.tokenizer, command.system_prompt, command.messages,
                                  command.context_window, command.raw, command.continue_reply)
            params = command.params
            if not command.raw and not has_chat_template(engine.tokenizer):
                params = replace(params, stop=[*params.stop, PLAIN_STOP])
            engine.add_request(rid, prompt.token_ids, params)
        except (PromptTooLong, ValueError) as error:  # RequestError is a ValueError
            self._emit(RequestFailed(rid, str(error)))
            return
        if not self._live:  # tokens/s is measured over busy time only
            self._new_tokens, self._last_stats = 0, time.monotonic()
        self._live.add(rid)
        if command.loop_guard:
            self._guarded.add(rid)
        self._token_counts[rid] = 0
        self._stats_dirty = True
        self._emit(PromptReady(rid, len(prompt.token_ids), prompt.dropped_messages,
                               prompt.truncated))

    def _abort(self, engine: LLMEngine, rid: str) -> None:
        if rid in self._live:
            engine.abort_request(rid)
            self._forget(rid)
            self._pending.pop(rid, None)
            self._stats_dirty = True

    def _forget(self, rid: str) -> None:
        self._live.discard(rid)
        self._guarded.discard(rid)
        self._token_counts.pop(rid, None)

    def _step(self, engine: LLMEngine) -> None:
        try:
            outputs = engine.step()
        except Exception as error:  # a failed step fails its requests, not the thread
            reason = f"the engine failed: {error or type(error).__name__}"
            for rid in list(self._live):
                self._pending.pop(rid, None)
                self._emit(RequestFailed(rid, reason))
                with contextlib.suppress(Exception):  # the engine is broken; drop it anyway
                    engine.abort_request(rid)
                self._forget(rid)
            return
        for output in outputs:
            rid = output.request_id
            if rid not in self._live:
                continue
            if output.error is not None:  # this reply alone failed inside the step
                self._pending.pop(rid, None)
                self._emit(RequestFailed(rid, f"the reply failed: {output.error}"))
                self._forget(rid)
                continue
            completion = output.outputs[0]
            count = len(completion.token_ids)
            # a snapshot with the prompt's blocks, for the inspector, however short the reply
            self._stats_due |= self._token_counts.get(rid, 0) == 0
            self._new_tokens += count - self._token_counts.get(rid, 0)
            self._token_counts[rid] = count
            finished, reason = output.finished, completion.finish_reason
            if not finished and rid in self._guarded and repeating(completion.token_ids):
                engine.abort_request(rid)  # its blocks are freed now; the text is kept
                finished, reason = True, LOOPED
            self._pending[rid] = ReplyUpdate(
                rid, completion.text, finished, reason,
                len(output.prompt_token_ids), output.num_cached_tokens, count,
                *((output.metrics.draft_tokens, output.metrics.accepted_tokens)
                  if output.metrics is not None else ()))
            if finished:
                self._forget(rid)
        self._stats_dirty = True

    def _flush(self, engine: LLMEngine, force: bool) -> None:
        now = time.monotonic()
        finished = any(update.finished for update in self._pending.values())
        if self._pending and (force or finished or now - self._last_flush >= self._flush_interval):
            updates, self._pending = list(self._pending.values()), {}
            for update in updates:
                self._emit(update)
            self._last_flush = now
        if self._stats_dirty and (force or self._stats_due
                                  or now - self._last_stats >= self._stats_interval):
            elapsed = max(now - self._last_stats, 1e-6)
            rate = self._new_tokens / elapsed if engine.has_unfinished_requests() else 0.0
            self._emit(StatsUpdate(engine.stats(), rate))
            self._new_tokens, self._last_stats = 0, now
            self._stats_dirty = self._stats_due = False
