import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pagedchat.chat.conversation import Message, SamplingSettings, Session
from pagedchat.chat.store import MIGRATIONS, Store, StoreError, default_db_path
from pagedchat.tui.commands.handlers import to_json, to_markdown


def test_round_trip_and_order(tmp_path):
    path = tmp_path / "chats.db"
    store = Store(path)
    first = store.create_session(Session(title="first", system_prompt="be kind"))
    second = store.create_session(Session(title="second",
                                          settings=SamplingSettings(temperature=0.1)))
    reply = Message("assistant", "", status="generating")
    store.add_turn(first, Message("user", "hello"), reply)
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
    store.add_turn(session, Message("user", "q"),
                   Message("assistant", "half a repl", status="generating"))
    assert store.mark_interrupted() == 1
    assert store.load_session(session.id).messages[1].status == "interrupted"


def test_a_turn_is_saved_whole_or_not_at_all(tmp_path):
    store = Store(tmp_path / "c.db")
    session = store.create_session(Session())
    user, reply = Message("user", "hello"), Message("assistant", "", status="generating")
    store.add_turn(session, user, reply)
    assert user.id is not None and reply.id == user.id + 1
    broken = Message("robot", "")  # the schema refuses the second row
    with pytest.raises(StoreError, match="CHECK constraint"):
        store.add_turn(session, Message("user", "lost?"), broken)
    assert broken.id is None
    assert [(m.role, m.content) for m in store.load_messages(session.id)] == [
        ("user", "hello"), ("assistant", "")]
    store.add_turn(session, Message("user", "again"), Message("assistant", "", "generating"))
    assert len(store.load_messages(session.id)) == 4  # no transaction was left open


def _save_alone(store: Store, session: Session, message: Message) -> None:
    """What the app did before add_turn: a message saved on its own after the last one."""
    store._insert(session, message, store._head(session))


def _statuses(store: Store, session: Session) -> list[tuple[str, str]]:
    return [(m.role, m.status) for m in store.load_messages(session.id)]


def test_user_messages_left_without_a_reply_are_marked_unanswered(tmp_path):
    store = Store(tmp_path / "c.db")
    last, middle, generating, failed = (store.create_session(Session()) for _ in range(4))
    _save_alone(store, last, Message("user", "the app ended before the reply was saved"))
    _save_alone(store, middle, Message("user", "its reply could not be saved"))
    store.add_turn(middle, Message("user", "so the user asked again"),
                   Message("assistant", "an answer"))
    store.add_turn(generating, Message("user", "q"),
                   Message("assistant", "half", status="generating"))
    store.add_turn(failed, Message("user", "q"),
                   Message("assistant", "", status="error", error="too long"))
    assert store.mark_interrupted() == 3
    assert _statuses(store, last) == [("user", "unanswered")]
    assert _statuses(store, middle) == [("user", "unanswered"), ("user", "done"),
                                        ("assistant", "done")]
    assert _statuses(store, generating) == [("user", "done"), ("assistant", "interrupted")]
    assert _statuses(store, failed) == [("user", "done"), ("assistant", "error")]
    assert store.mark_interrupted() == 0
    assert store.load_session(last.id).history() == [
        {"role": "user", "content": "the app ended before the reply was saved"}]


def test_updating_a_message_that_is_not_stored_is_an_error(tmp_path):
    store = Store(tmp_path / "c.db")
    session = store.create_session(Session())
    with pytest.raises(StoreError, match="never saved"):
        store.update_message(Message("assistant", "text"))
    reply = Message("assistant", "", status="generating")
    store.add_turn(session, Message("user", "q"), reply)
    store.clear_messages(session.id)
    with pytest.raises(StoreError, match="no longer stored"):
        store.update_message(reply)


KILLED_CHAT = """
import os, signal, sys
from pagedchat.chat.conversation import Message, Session
from pagedchat.chat.store import Store

def die(*args):
    os.kill(os.getpid(), signal.SIGKILL)

store = Store(sys.argv[1])
session = store.create_session(Session())
user, reply = Message("user", "hello"), Message("assistant", "", status="generating")
if sys.argv[2] == "inside a turn":
    insert, calls = Store._insert, []
    def insert_then_die(self, *args):
        insert(self, *args)
        calls.append(1)
        if len(calls) == 2:
            die()
    Store._insert = insert_then_die
    store.add_turn(session, user, reply)
elif sys.argv[2] == "between two saves":  # the app before add_turn
    store._insert(session, user, None)  # saved alone, as its first message
    die()
store.add_turn(session, user, reply)
reply.content = "half a rep"
store.update_message(reply)
die()
"""


@pytest.mark.parametrize("where, left", [
    ("inside a turn", []),
    ("between two saves", [("user", "unanswered", "hello")]),
    ("while generating", [("user", "done", "hello"), ("assistant", "interrupted", "half a rep")]),
])
def test_a_killed_app_leaves_every_user_message_answered_or_marked(tmp_path, where, left):
    path = tmp_path / "c.db"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    killed = subprocess.run([sys.executable, "-c", KILLED_CHAT, str(path), where], env=env,
                            capture_output=True, timeout=120)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    store = Store(path)
    store.mark_interrupted()  # what the app does when it starts
    session = store.list_sessions()[0]
    assert [(m.role, m.status, m.content) for m in store.load_messages(session.id)] == left


def test_delete_and_clear(tmp_path):
    store = Store(tmp_path / "c.db")
    a, b = store.create_session(Session()), store.create_session(Session())
    store.add_turn(a, Message("user", "x"), Message("assistant", "x?"))
    store.add_turn(b, Message("user", "y"), Message("assistant", "y?"))
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
        Message("user", "q"), Message("assistant", "partial", status="cancelled"),
        Message("user", "lost", status="unanswered")])
    md = to_markdown(session)
    assert md.startswith("# T\n") and "**System:** S" in md
    assert "## You\n\nq" in md and "## Assistant (cancelled)\n\npartial" in md
    assert "## You (no reply)\n\nlost" in md
    data = json.loads(to_json(session))
    assert data["title"] == "T" and data["messages"][1]["status"] == "cancelled"
    assert data["settings"]["max_tokens"] == SamplingSettings().max_tokens


def test_an_old_database_is_upgraded_in_place_to_the_tree(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(f"BEGIN; {MIGRATIONS[0]}; PRAGMA user_version = 1; COMMIT;")
    db.execute("INSERT INTO sessions (title, system_prompt, settings, created_at, updated_at) "
               "VALUES ('old', '', '{}', 1, 1)")
    for i, role in enumerate(["user", "assistant", "user", "assistant"]):
        db.execute("INSERT INTO messages (session_id, role, content, status, created_at) "
                   "VALUES (1, ?, ?, 'done', ?)", (role, f"m{i}", i))
    db.commit()
    db.close()
    store = Store(path)
    assert store.schema_version == len(MIGRATIONS)
    messages = store.load_messages(1)
    assert [m.content for m in messages] == ["m0", "m1", "m2", "m3"]
    assert [m.parent_id for m in messages] == [None, *[m.id for m in messages[:-1]]]
    assert all(m.branch == (1, 1) for m in messages)


def test_regenerated_replies_and_edited_messages_branch_and_can_be_switched(tmp_path):
    store = Store(tmp_path / "c.db")
    session = store.create_session(Session())
    question, first = Message("user", "why?"), Message("assistant", "because")
    store.add_turn(session, question, first)
    session.messages = store.load_messages(session.id)
    second = Message("assistant", "it depends")
    store.add_reply(session, question, second)  # a regenerated reply
    session.messages = store.load_messages(session.id)
    assert [m.content for m in session.messages] == ["why?", "it depends"]
    assert session.messages[-1].branch == (2, 2)
    assert store.alternatives(second) == [first.id, second.id]
    store.switch_to(session, first.id)
    assert [m.content for m in session.messages] == ["why?", "because"]
    assert session.messages[-1].branch == (1, 2)
    store.add_turn(session, Message("user", "and then?"), Message("assistant", "then this"))
    edited = Message("user", "why not?")  # an edit of the first question: a new branch
    store.add_turn(session, edited, Message("assistant", "no reason"), instead_of=question)
    session.messages = store.load_messages(session.id)
    assert [m.content for m in session.messages] == ["why not?", "no reason"]
    assert session.messages[0].branch == (2, 2)
    store.switch_to(session, question.id)  # back to the first question: its newest branch
    assert [m.content for m in session.messages] == ["why?", "because", "and then?",
                                                     "then this"]
    store.close()
    assert [m.content for m in Store(tmp_path / "c.db").load_messages(session.id)] == [
        "why?", "because", "and then?", "then this"]  # the current branch survives a restart
