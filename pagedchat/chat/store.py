"""Sessions and messages in SQLite, in the user's data folder.

The schema carries a version (``PRAGMA user_version``); ``MIGRATIONS`` brings any
older database up to date in order, each step in one transaction."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import asdict
from pathlib import Path

from pagedchat.chat.conversation import Message, SamplingSettings, Session

MIGRATIONS: list[str] = [
    # 1: sessions and their messages
    """
    CREATE TABLE sessions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        title TEXT NOT NULL,
        system_prompt TEXT NOT NULL,
        settings TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
        content TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at REAL NOT NULL,
        prompt_tokens INTEGER NOT NULL DEFAULT 0,
        cached_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        dropped_messages INTEGER NOT NULL DEFAULT 0,
        error TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX messages_by_session ON messages (session_id, id);
    """,
    # 2: a session is a tree of messages (regenerated replies, edited messages branch off);
    # each message names the one it follows, the session the last message of its branch
    """
    ALTER TABLE messages ADD COLUMN parent_id INTEGER
        REFERENCES messages(id) ON DELETE CASCADE;
    ALTER TABLE sessions ADD COLUMN head_id INTEGER;
    UPDATE messages SET parent_id = (SELECT MAX(before.id) FROM messages AS before
        WHERE before.session_id = messages.session_id AND before.id < messages.id);
    UPDATE sessions SET head_id = (SELECT MAX(m.id) FROM messages AS m
        WHERE m.session_id = sessions.id);
    CREATE INDEX messages_by_parent ON messages (parent_id);
    """,
]

_MESSAGE_FIELDS = ("role", "content", "status", "created_at", "prompt_tokens",
                   "cached_tokens", "output_tokens", "dropped_messages", "error", "parent_id")


class StoreError(Exception):
    """The database could not be opened, read or written; the message says why."""


def default_db_path() -> Path:
    """``$PAGEDCHAT_DATA_DIR/chats.db``, else ``$XDG_DATA_HOME/pagedchat/chats.db``."""
    if os.environ.get("PAGEDCHAT_DATA_DIR"):
        return Path(os.environ["PAGEDCHAT_DATA_DIR"]).expanduser() / "chats.db"
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "pagedchat" / "chats.db"


class Store:
    """One connection, used by one thread (the UI's)."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._migrate()
        except (OSError, sqlite3.Error) as error:
            raise StoreError(f"{self.path}: cannot open the chat database ({error})") from error

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        version = self.schema_version
        if version > len(MIGRATIONS):
            raise StoreError(f"{self.path}: schema version {version} is newer than this "
                             f"pagedchat knows ({len(MIGRATIONS)}); upgrade pagedchat")
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            try:
                self._db.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")
            except sqlite3.Error:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        self._db.close()

    def _run(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, args)
        except sqlite3.Error as error:
            raise StoreError(f"{self.path}: {error}") from error

    def create_session(self, session: Session) -> Session:
        session.created_at = session.updated_at = time.time()
        cursor = self._run("INSERT INTO sessions (title, system_prompt, settings, created_at, "
                           "updated_at) VALUES (?, ?, ?, ?, ?)",
                           (session.title, session.system_prompt,
                            json.dumps(asdict(session.settings)), session.created_at,
                            session.updated_at))
        session.id = cursor.lastrowid
        return session

    def save_session(self, session: Session) -> None:
        """Write title, system prompt and settings."""
        session.updated_at = time.time()
        self._run("UPDATE sessions SET title = ?, system_prompt = ?, settings = ?, "
                  "updated_at = ? WHERE id = ?",
                  (session.title, session.system_prompt, json.dumps(asdict(session.settings)),
                   session.updated_at, session.id))

    def delete_session(self, session_id: int) -> None:
        self._run("DELETE FROM sessions WHERE id = ?", (session_id,))

    def list_sessions(self) -> list[Session]:
        """Every session, most recently used first, without its messages."""
        rows = self._run("SELECT * FROM sessions ORDER BY updated_at DESC, id DESC").fetchall()
        return [_session(row) for row in rows]

    def load_session(self, session_id: int) -> Session | None:
        """The session with its messages, or None when there is no such session."""
        row = self._run("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            return None
        session = _session(row)
        session.messages = self.load_messages(session_id)
        return session

    def load_messages(self, session_id: int) -> list[Message]:
        """The session's current branch, oldest first: the messages its last one follows,
        each with its place among the alternatives at that point (``branch``)."""
        rows = self._run(
            "WITH RECURSIVE branch(id) AS ("
            " SELECT head_id FROM sessions WHERE id = ? AND head_id IS NOT NULL"
            " UNION ALL SELECT m.parent_id FROM messages AS m JOIN branch ON m.id = branch.id"
            " WHERE m.parent_id IS NOT NULL) "
            "SELECT m.*, (SELECT COUNT(*) FROM messages AS s WHERE s.session_id = m.session_id"
            " AND s.parent_id IS m.parent_id AND s.role = m.role AND s.id <= m.id) AS place,"
            " (SELECT COUNT(*) FROM messages AS s WHERE s.session_id = m.session_id"
            " AND s.parent_id IS m.parent_id AND s.role = m.role) AS places "
            "FROM messages AS m JOIN branch ON m.id = branch.id ORDER BY m.id", (session_id,),
        ).fetchall()
        return [Message(id=row["id"], branch=(row["place"], row["places"]),
                        **{name: row[name] for name in _MESSAGE_FIELDS}) for row in rows]

    def alternatives(self, message: Message) -> list[int]:
        """The ids of ``message`` and the other messages of its role that follow the same
        one (regenerated replies, edited messages), oldest first."""
        rows = self._run(
            "SELECT id FROM messages WHERE session_id = (SELECT session_id FROM messages "
            "WHERE id = ?) AND parent_id IS ? AND role = ? ORDER BY id",
            (message.id, message.parent_id, message.role)).fetchall()
        return [row["id"] for row in rows]

    def switch_to(self, session: Session, message_id: int) -> None:
        """Make the branch through ``message_id`` the session's current one, down to the
        newest message written after it (the branch last written in)."""
        head = self._run(
            "WITH RECURSIVE below(id) AS (SELECT ? UNION ALL SELECT m.id FROM messages AS m "
            "JOIN below ON m.parent_id = below.id) SELECT MAX(id) AS id FROM below",
            (message_id,)).fetchone()["id"]
        self._run("UPDATE sessions SET head_id = ? WHERE id = ?", (head, session.id))
        session.messages = self.load_messages(session.id)

    def add_turn(self, session: Session, user: Message, reply: Message,
                 instead_of: Message | None = None) -> None:
        """Save a user message and the reply about to answer it (or say why not), both or neither
        (when this raises, neither has an id). It follows the session's last message or, as an
        edit of ``instead_of``, the message that one follows (a new branch)."""
        try:
            self._run("BEGIN")
            self._insert(session, user, instead_of.parent_id if instead_of is not None
                         else self._head(session))
            self._insert(session, reply, user.id)
            self._run("COMMIT")
        except StoreError:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            user.id = reply.id = None
            raise

    def add_reply(self, session: Session, user: Message, reply: Message) -> None:
        """Save another reply to ``user`` (a regenerated one), now the session's last."""
        self._insert(session, reply, user.id)

    def _head(self, session: Session) -> int | None:
        row = self._run("SELECT head_id FROM sessions WHERE id = ?", (session.id,)).fetchone()
        return row["head_id"] if row is not None else None

    def _insert(self, session: Session, message: Message, parent_id: int | None) -> None:
        """Store ``message`` after message ``parent_id`` (it gets its id) as the session's
        last, and mark the session as just used."""
        message.parent_id = parent_id
        values = tuple(getattr(message, name) for name in _MESSAGE_FIELDS)
        cursor = self._run(f"INSERT INTO messages (session_id, {', '.join(_MESSAGE_FIELDS)}) "
                           f"VALUES (?, {', '.join('?' * len(_MESSAGE_FIELDS))})",
                           (session.id, *values))
        message.id = cursor.lastrowid
        session.updated_at = time.time()
        self._run("UPDATE sessions SET head_id = ?, updated_at = ? WHERE id = ?",
                  (message.id, session.updated_at, session.id))

    def update_message(self, message: Message) -> None:
        """Write the message's content, status and figures; StoreError when it is not stored
        (never saved, or deleted), rather than losing the write without a word."""
        if message.id is None:
            raise StoreError(f"{self.path}: the message was never saved, so it cannot be updated")
        names = _MESSAGE_FIELDS[1:]
        cursor = self._run(
            f"UPDATE messages SET {', '.join(f'{name} = ?' for name in names)} WHERE id = ?",
            (*(getattr(message, name) for name in names), message.id))
        if cursor.rowcount == 0:
            raise StoreError(f"{self.path}: message {message.id} is no longer stored")

    def clear_messages(self, session_id: int) -> None:
        self._run("DELETE FROM messages WHERE session_id = ?", (session_id,))
        self._run("UPDATE sessions SET head_id = NULL WHERE id = ?", (session_id,))

    def mark_interrupted(self) -> int:
        """Mark what an earlier exit left unfinished; returns how many messages it marked: a
        reply left 'generating' becomes 'interrupted', a user message with no reply saved
        after it 'unanswered'. Call it once at startup, before any reply is under way."""
        replies = self._run(
            "UPDATE messages SET status = 'interrupted' WHERE status = 'generating'").rowcount
        users = self._run(
            "UPDATE messages SET status = 'unanswered' WHERE role = 'user' AND status = 'done' "
            "AND NOT EXISTS (SELECT 1 FROM messages AS reply "
            "WHERE reply.parent_id = messages.id AND reply.role = 'assistant')").rowcount
        return replies + users


def _session(row: sqlite3.Row) -> Session:
    try:
        settings = SamplingSettings.from_dict(json.loads(row["settings"]))
    except (ValueError, TypeError):
        settings = SamplingSettings()
    return Session(title=row["title"], system_prompt=row["system_prompt"], settings=settings,
                   id=row["id"], created_at=row["created_at"], updated_at=row["updated_at"])
