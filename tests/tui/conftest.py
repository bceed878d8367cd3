"""Helpers for the app tests: an app on a fresh database and an engine, and waiting.

Most tests run the app on a ``FakeEngine`` (a fixed reply, no model); the tests that pin
the app against the engine itself (its blocks, prefix sharing, a failed load) ask for the
tiny random Llama with ``engine="tiny"``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import partial

import pytest

from pagedchat.chat.conversation import SamplingSettings
from pagedchat.chat.driver import load_engine
from pagedchat.chat.store import Store
from pagedchat.tui.app import ChatApp
from tests.fake_engine import FakeEngine


@pytest.fixture
def fake_engine(tiny_tokenizer) -> FakeEngine:
    """The engine of ``make_app()``; ``hold()`` it to keep replies mid-stream."""
    return FakeEngine(tiny_tokenizer, num_kv_blocks=256)


@pytest.fixture
def make_app(request, tmp_path, fake_engine) -> Iterator[Callable[..., ChatApp]]:
    """``make_app(**options)``: a ChatApp on ``tmp_path/chats.db``, greedy, with short
    replies unless ``settings`` says otherwise. ``engine`` is ``"fake"`` (the
    ``fake_engine`` fixture), ``"tiny"`` (the tiny Llama, or the folder ``model``, with
    ``kv_blocks`` blocks and every step ``step_delay`` seconds slower) or False (the model
    never finishes loading: the UI alone, no CPU spent on an engine)."""
    never = threading.Event()

    def no_engine():
        never.wait()
        raise RuntimeError("the test ended")

    def fake() -> FakeEngine:
        return fake_engine

    def make(settings: SamplingSettings | None = None, engine: str | bool = "fake",
             kv_blocks: int = 256, model: str | None = None, step_delay: float = 0.0,
             **options) -> ChatApp:
        settings = settings or SamplingSettings(temperature=0.0, max_tokens=8, seed=0)
        if engine == "tiny":
            folder = model or str(request.getfixturevalue("tiny_model_dir"))
            options.setdefault("load_model", partial(load_engine, num_kv_blocks=kv_blocks))
            loader = partial(options["load_model"], folder)
            if step_delay:
                loader = partial(slowed, loader, step_delay)
        else:
            loader = fake if engine == "fake" else no_engine
        return ChatApp(Store(tmp_path / "chats.db"), loader, "tiny-llama", settings=settings,
                       **options)

    yield make
    never.set()


def slowed(loader: Callable, delay: float):
    """The engine from ``loader`` with every step taking ``delay`` seconds longer: a slow
    model, so that tests see streaming and overlap however fast this machine is."""
    engine = loader()
    step = engine.step

    def slow_step():
        time.sleep(delay)
        return step()

    engine.step = slow_step
    return engine


async def wait_until(pilot, condition: Callable[[], bool], timeout: float = 60.0,
                     step: float = 0.02) -> None:
    """Let the app run until ``condition()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {condition}")
        await pilot.pause(step)


async def ready(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.replies.engine_ready)


async def say(pilot, text: str) -> None:
    """Type ``text`` in the input box and press Enter."""
    pilot.app.query_one("#input").focus()
    pilot.app.query_one("#input").insert(text)
    await pilot.press("enter")
    await pilot.pause()


async def replies_done(pilot) -> None:
    await wait_until(pilot, lambda: not pilot.app.replies.turns)
