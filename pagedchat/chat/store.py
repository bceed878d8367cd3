"""Sessions and messages in SQLite, in the user's data folder.

The schema carries a version (``PRAGMA user_version``); ``MIGRATIONS`` brings any
older database up to date in order, each step in one transaction.
"""

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
]

_MESSAGE_FIELDS = ("role", "content", "status", "created_at", "prompt_tokens",
                   "cached_tokens", "output_tokens", "dropped_messages", "error")


class StoreError(Exception):
    """The database could not be opened, read or written; the message says why."""


def data_dir() -> Path:
    """``$PAGEDCHAT_DATA_DIR``, or ``pagedchat`` in ``$XDG_DATA_HOME`` (``~/.local/share``)."""
    if os.environ.get("PAGEDCHAT_DATA_DIR"):
        return Path(os.environ["PAGEDCHAT_DATA_DIR"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "pagedchat"


def default_db_path() -> Path:
    return data_dir() / "chats.db"


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
            raise StoreError(
                f"{self.path}: schema version {version} is newer than this pagedchat "
                f"knows ({len(MIGRATIONS)}); upgrade pagedchat"
            )
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            # Each step applies whole or not at all.
            try:
                self._db.executescript(
                    f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;"
                )
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

    # sessions

    def create_session(self, session: Session) -> Session:
        session.created_at = session.updated_at = time.time()
        cursor = self._run(
            "INSERT INTO sessions (title, system_prompt, settings, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (session.title, session.system_prompt, json.dumps(asdict(session.settings)),
             session.created_at, session.updated_at),
        )
        session.id = cursor.lastrowid
        return session

    def save_session(self, session: Session) -> None:
        """Write title, system prompt and settings."""
        session.updated_at = time.time()
        self._run(
            "UPDATE sessions SET title = ?, system_prompt = ?, settings = ?, updated_at = ? "
            "WHERE id = ?",
            (session.title, session.system_prompt, json.dumps(asdict(session.settings)),
             session.updated_at, session.id),
        )

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
        rows = self._run(
            "SELECT * FROM messages WHERE session_id = ? ORDER BY id", (session_id,)
        ).fetchall()
        return [Message(id=row["id"], **{name: row[name] for name in _MESSAGE_FIELDS})
                for row in rows]

    # messages

    def add_message(self, session: Session, message: Message) -> Message:
        """Insert ``message`` (it gets its id) and mark the session as just used."""
        self._insert(session, message)
        self._touch(session)
        return message

    def add_turn(self, session: Session, user: Message, reply: Message) -> None:
        """Save a user message with the reply about to be written to it, both or neither.

        So a user message is never stored without the reply that answers it or, by its
        status, says why not; when this raises, neither has an id and nothing is stored."""
        try:
            self._run("BEGIN")
            self._insert(session, user)
            self._insert(session, reply)
            self._touch(session)
            self._run("COMMIT")
        except StoreError:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            user.id = reply.id = None
            raise

    def _insert(self, session: Session, message: Message) -> None:
        values = tuple(getattr(message, name) for name in _MESSAGE_FIELDS)
        cursor = self._run(
            f"INSERT INTO messages (session_id, {', '.join(_MESSAGE_FIELDS)}) "
            f"VALUES (?, {', '.join('?' * len(_MESSAGE_FIELDS))})",
            (session.id, *values),
        )
        message.id = cursor.lastrowid

    def _touch(self, session: Session) -> None:
        session.updated_at = time.time()
        self._run("UPDATE sessions SET updated_at = ? WHERE id = ?",
                  (session.updated_at, session.id))

    def update_message(self, message: Message) -> None:
        """Write the message's content, status and figures; StoreError when it is not stored
        (never saved, or deleted), rather than losing the write without a word."""
        if message.id is None:
            raise StoreError(f"{self.path}: the message was never saved, so it cannot be "
                             "updated")
        names = _MESSAGE_FIELDS[1:]
        cursor = self._run(
            f"UPDATE messages SET {', '.join(f'{name} = ?' for name in names)} WHERE id = ?",
            (*(getattr(message, name) for name in names), message.id),
        )
        if cursor.rowcount == 0:
            raise StoreError(f"{self.path}: message {message.id} is no longer stored")

    def clear_messages(self, session_id: int) -> None:
        self._run("DELETE FROM messages WHERE session_id = ?", (session_id,))

    def mark_interrupted(self) -> int:
        """Mark what an earlier exit left unfinished; returns how many messages it marked.

        A reply left 'generating' becomes 'interrupted'; a user message with no reply saved
        after it (the app ended, or saving the reply failed, before one was) becomes
        'unanswered'. Call it once at startup, before any reply is under way."""
        replies = self._run(
            "UPDATE messages SET status = 'interrupted' WHERE status = 'generating'").rowcount
        users = self._run(
            "UPDATE messages SET status = 'unanswered' WHERE role = 'user' AND status = 'done' "
            "AND COALESCE((SELECT after.role FROM messages AS after "
            "WHERE after.session_id = messages.session_id AND after.id > messages.id "
            "ORDER BY after.id LIMIT 1), '') != 'assistant'").rowcount
        return replies + users


def _session(row: sqlite3.Row) -> Session:
    try:
        settings = SamplingSettings.from_dict(json.loads(row["settings"]))
    except (ValueError, TypeError):
        settings = SamplingSettings()
    return Session(title=row["title"], system_prompt=row["system_prompt"], settings=settings,
                   id=row["id"], created_at=row["created_at"], updated_at=row["updated_at"])
