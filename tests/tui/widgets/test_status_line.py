"""While the model loads, the status line names the one-time jobs it waits for (compiling
the kernels, converting a model) with their steps, reported from the thread doing them."""

from __future__ import annotations

import threading

from pagedchat import progress
from pagedchat.tui.widgets.status_line import StatusLine
from tests.tui.conftest import wait_until

COMPILE = "compiling the C kernels for this CPU (avx2), once"


def run_job(description: str, total: int | None, steps: int, go_on: threading.Event,
            ) -> threading.Thread:
    """A job on a thread of its own: ``steps`` steps, then it waits for ``go_on`` to end."""
    def work() -> None:
        with progress.task(description, total) as advance:
            for _ in range(steps):
                advance(1)
            go_on.wait(30)

    thread = threading.Thread(target=work)
    thread.start()
    return thread


async def test_one_time_jobs_are_named_with_their_steps_while_the_model_loads(make_app):
    app = make_app(engine=False)  # the model never loads: its line stays "loading"
    async with app.run_test(size=(140, 30)) as pilot:
        status = app.query_one(StatusLine)
        compiled, converted = threading.Event(), threading.Event()
        compiling = run_job(COMPILE, 13, 5, compiled)
        await wait_until(pilot, lambda: f"{COMPILE} (5/13)" in status.model_state)
        converting = run_job("converting model.gguf to float32 weights, once", None, 0,
                             converted)
        await wait_until(pilot, lambda: "converting model.gguf" in status.model_state)
        assert status.model_state.startswith("◌ loading tiny-llama")
        assert status.model_state.index(COMPILE) < status.model_state.index("converting")
        compiled.set()
        compiling.join()
        await wait_until(pilot, lambda: "compiling" not in status.model_state)
        assert status.model_state.endswith(" · converting model.gguf to float32 weights, once")
        converted.set()
        converting.join()
        await wait_until(pilot, lambda: " · " not in status.model_state)
        assert "loading tiny-llama" in str(app.query_one("#model-state").content)
    assert progress._reporters == []  # the widget's reporter leaves with it
