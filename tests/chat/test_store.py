import json
import sqlite3

import pytest

from pagedchat.chat.conversation import Message, SamplingSettings, Session
from pagedchat.chat.export import to_json, to_markdown
from pagedchat.chat.store import MIGRATIONS, Store, StoreError, default_db_path


def test_round_trip_and_order(tmp_path):
    path = tmp_path / "chats.db"
    store = Store(path)
    first = store.create_session(Session(title="first", system_prompt="be kind"))
    second = store.create_session(Session(title="second",
                                          settings=SamplingSettings(temperature=0.1)))
    store.add_message(first, Message("user", "hello"))
    reply = store.add_message(first, Message("assistant", "", status="generating"))
    reply.content, reply.status, reply.cached_tokens = "hi there", "done", 16
    store.update_message(reply)
    store.close()

    store = Store(path)
    assert store.schema_version == len(MIGRATIONS)
    assert [s.title for s in store.list_sessions()] == ["first", "second"]
    loaded = store.load_session(first.id)
    assert loaded.system_prompt == "be kind"
    assert [(m.role, m.content, m.status) for m in loaded.messages] == [
        ("user", "hello", "done"), ("assistant", "hi there", "done")]
    assert loaded.messages[1].cached_tokens == 16
    assert store.load_session(second.id).settings.temperature == 0.1
    assert store.load_session(999) is None


def test_generating_replies_become_interrupted(tmp_path):
    store = Store(tmp_path / "c.db")
    session = store.create_session(Session())
    store.add_message(session, Message("assistant", "half a repl", status="generating"))
    assert store.mark_interrupted() == 1
    assert store.load_session(session.id).messages[0].status == "interrupted"


def test_delete_and_clear(tmp_path):
    store = Store(tmp_path / "c.db")
    a, b = store.create_session(Session()), store.create_session(Session())
    store.add_message(a, Message("user", "x"))
    store.add_message(b, Message("user", "y"))
    store.clear_messages(b.id)
    assert store.load_session(b.id).messages == []
    store.delete_session(a.id)
    assert store.load_session(a.id) is None
    assert store._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "c.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer"):
        Store(path)


def test_unwritable_location_is_a_store_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="cannot open"):
        Store(blocker / "sub" / "c.db")


def test_data_dir_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGEDCHAT_DATA_DIR", str(tmp_path / "d"))
    assert default_db_path() == tmp_path / "d" / "chats.db"
    monkeypatch.delenv("PAGEDCHAT_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "x"))
    assert default_db_path() == tmp_path / "x" / "pagedchat" / "chats.db"


def test_exports():
    session = Session(title="T", system_prompt="S", messages=[
        Message("user", "q"), Message("assistant", "partial", status="cancelled")])
    md = to_markdown(session)
    assert md.startswith("# T\n") and "**System:** S" in md
    assert "## You\n\nq" in md and "## Assistant (cancelled)\n\npartial" in md
    data = json.loads(to_json(session))
    assert data["title"] == "T" and data["messages"][1]["status"] == "cancelled"
    assert data["settings"]["max_tokens"] == SamplingSettings().max_tokens
