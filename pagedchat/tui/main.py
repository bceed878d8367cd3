"""The function behind `pagedchat chat`: open the store, check the session, run the app."""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path

import typer

from pagedchat.chat.conversation import SamplingSettings
from pagedchat.chat.driver import load_engine
from pagedchat.chat.store import Store, StoreError
from pagedchat.engine.loading.named_models import DEFAULT_MODEL_NAME
from pagedchat.engine.presets import PRESETS, swap_space

CHAT = PRESETS["chat"]


def run_chat(*, model: str | None, db: Path | None, continue_last: bool, session_id: int | None,
             context_window: int, raw: bool, settings: SamplingSettings, system_prompt: str,
             engine_options: dict[str, object]) -> None:
    """``settings`` and ``system_prompt`` are those of new sessions; ``engine_options``: the
    engine's options by EngineConfig's names (KV blocks, weights, speculation, the KV store)."""
    from pagedchat.tui.app import ChatApp  # Textual loads only when the app runs

    try:
        store = Store(db)
        if session_id is not None and store.load_session(session_id) is None:
            raise typer.BadParameter(f"there is no session {session_id} in {store.path}",
                                     param_hint="--session")
    except StoreError as error:
        raise typer.BadParameter(str(error), param_hint="--db") from error
    name = Path(model).name if model else DEFAULT_MODEL_NAME
    load_model = partial(load_engine, max_num_seqs=CHAT.max_num_seqs,
                         swap_space=swap_space("recompute"), **engine_options)
    app = ChatApp(store, partial(load_model, model), name, context_window=context_window,
                  raw=raw, session_id=session_id, continue_last=continue_last,
                  settings=settings, system_prompt=system_prompt, load_model=load_model)
    app.run()
    if not app.engine_stopped:
        # The engine thread is inside a model load or a step that cannot be interrupted;
        # at interpreter exit torch would abort under it. Everything is saved: leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(app.return_code or 0)
