"""The engine driver: one thread owns the engine; commands in, events out.

Most tests drive a ``FakeEngine``; cancelling runs on the tiny Llama, so that the real
pool is seen to get its blocks back."""

from __future__ import annotations

import queue
import time

import pytest

from pagedchat.chat.conversation import DEFAULT_SYSTEM_PROMPT
from pagedchat.chat.driver import (
    LOOPED,
    EngineDriver,
    EngineFailed,
    EngineReady,
    PromptReady,
    ReplyUpdate,
    RequestFailed,
    StatsUpdate,
    Submit,
)
from pagedchat.engine.errors import ModelLoadError
from pagedchat.engine.sampling_params import SamplingParams
from tests.fake_engine import FakeEngine


class Events:
    """Collects a driver's events and waits for the ones a test expects."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.seen: list = []

    def __call__(self, event) -> None:
        self.queue.put(event)

    def wait_for(self, test, timeout: float = 60.0, since: int = 0):
        """The first event from ``seen[since]`` on that passes ``test``, waiting for more."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.seen[since:]:
                if test(event):
                    return event
            try:
                self.seen.append(self.queue.get(timeout=max(deadline - time.monotonic(), 0)))
            except queue.Empty:
                raise AssertionError(f"no matching event; saw {self.seen}") from None


def submit(rid: str, text: str, max_tokens: int, window: int = 1024) -> Submit:
    return Submit(rid, DEFAULT_SYSTEM_PROMPT, [{"role": "user", "content": text}],
                  SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True), window)


@pytest.fixture
def start(request, tiny_tokenizer):
    """``start(engine, **options)``: a started driver and its events, over a new
    ``FakeEngine`` (``engine="fake"``) or the shared tiny engine (``engine="tiny"``)."""
    runs = []

    def start_driver(engine: str = "fake", **options) -> tuple[EngineDriver, Events, object]:
        if engine == "fake":
            target = FakeEngine(tiny_tokenizer, num_kv_blocks=256)
        else:
            target = request.getfixturevalue("tiny_llm").engine
        events = Events()
        driver = EngineDriver(lambda: target, events, **options)
        driver.start()
        runs.append((driver, target))
        return driver, events, target

    yield start_driver
    for driver, engine in runs:
        assert driver.stop()
        assert not engine.has_unfinished_requests()


def test_updates_are_coalesced_and_the_end_comes_at_once(start):
    driver, events, _ = start(flush_interval=30.0)
    events.wait_for(lambda e: isinstance(e, EngineReady))
    driver.submit(submit("a", "hello", 40))
    ready = events.wait_for(lambda e: isinstance(e, PromptReady))
    assert ready.request_id == "a" and ready.prompt_tokens > 48 and ready.dropped_messages == 0
    final = events.wait_for(lambda e: isinstance(e, ReplyUpdate) and e.finished)
    assert final.output_tokens == 40 and final.finish_reason == "length"
    assert [e for e in events.seen if isinstance(e, ReplyUpdate)] == [final]
    stats = events.wait_for(lambda e: isinstance(e, StatsUpdate) and e.stats.num_running == 0
                            and e is events.seen[-1])
    assert stats.stats.used_blocks == 0


def test_stop_aborts_what_is_running(start):
    driver, events, engine = start()
    engine.hold()
    driver.submit(submit("a", "hello", 2000))
    engine.allow(1)
    events.wait_for(lambda e: isinstance(e, ReplyUpdate) and e.output_tokens > 0)
    assert driver.stop()  # the fixture checks that the engine has nothing left
    assert engine.is_shut_down


def test_cancel_frees_the_blocks_and_silences_the_request(start):
    driver, events, _ = start("tiny")
    driver.submit(submit("long", "go on", 2000))
    events.wait_for(lambda e: isinstance(e, ReplyUpdate) and e.output_tokens > 2)
    cancelled_at = len(events.seen)
    driver.cancel("long")
    # the pool is empty again only once the cancel is served (the first StatsUpdate, before
    # "long" was added, showed an empty pool too)
    events.wait_for(lambda e: isinstance(e, StatsUpdate) and e.stats.used_blocks == 0,
                    since=cancelled_at)
    count = len(events.seen)
    driver.submit(submit("next", "and now", 3))
    events.wait_for(lambda e: isinstance(e, ReplyUpdate) and e.finished)
    assert not any(isinstance(e, ReplyUpdate) and e.request_id == "long"
                   for e in events.seen[count:])


def test_a_prompt_that_cannot_fit_fails_alone(start):
    driver, events, _ = start()
    driver.submit(submit("big", "hi", 4, window=20))
    driver.submit(submit("ok", "hi", 4))
    failed = events.wait_for(lambda e: isinstance(e, RequestFailed))
    assert failed.request_id == "big" and "context window of 20" in failed.error
    done = events.wait_for(lambda e: isinstance(e, ReplyUpdate) and e.finished)
    assert done.request_id == "ok"


def test_a_failed_load_is_reported_and_requests_refused():
    events = Events()

    def broken():
        raise ModelLoadError("/nowhere: no such file or folder")

    driver = EngineDriver(broken, events)
    driver.start()
    driver.submit(submit("a", "hello", 4))
    failed = events.wait_for(lambda e: isinstance(e, EngineFailed))
    assert "no such file" in failed.error
    refused = events.wait_for(lambda e: isinstance(e, RequestFailed))
    assert refused.request_id == "a" and "failed to load" in refused.error
    assert driver.stop()


@pytest.mark.parametrize("guarded", [True, False])
def test_the_repetition_guard_stops_a_looping_reply(start, guarded):
    driver, events, engine = start()
    engine.answer_with("The block table maps logical blocks to physical blocks. ")  # cycles
    command = submit("a", "hello", 400)
    driver.submit(Submit(**{**command.__dict__, "loop_guard": guarded}))
    final = events.wait_for(lambda e: isinstance(e, ReplyUpdate) and e.finished)
    if guarded:
        assert final.finish_reason == LOOPED and final.output_tokens < 100
        assert final.text.startswith("The block table maps")
    else:
        assert final.finish_reason == "length" and final.output_tokens == 400
    stats = events.wait_for(lambda e: isinstance(e, StatsUpdate) and e.stats.num_running == 0)
    assert stats.stats.used_blocks == 0
