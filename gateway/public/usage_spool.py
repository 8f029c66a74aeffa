"""A durable, bounded first-in first-out queue of Kafka records in one sqlite file (WAL mode).

The public gateway writes its usage events (requests.completed) here before anything tries Kafka, and
deletes them only once the broker has acknowledged them (gateway/public/usage_events.py).

Why sqlite and not an outbox table in PostgreSQL: the public gateway must record usage through a
PostgreSQL outage, and it holds no write grant on PostgreSQL (least privilege), so an outbox can't be its
store. sqlite is a maintained, crash-safe store in the standard library: a committed append survives the
process being killed, and with synchronous=FULL a power loss too, where a hand-written file format would
have to get torn writes and fsync right on its own.

One spool, one process: open() takes an exclusive lock on `<file>.lock`, so a second gateway pointed at
the same file refuses to start instead of sending the same events twice and racing the first's deletes.
The spool holds at most max_events: an append past it keeps the oldest and drops the newest.
A UsageSpool is not thread-safe; the publisher calls it from one worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    key BLOB NOT NULL,
    value BLOB NOT NULL
)"""


class SpoolInUse(RuntimeError):
    """Another live process holds this spool file."""


@dataclass(frozen=True)
class Record:
    """One Kafka record, as sent."""

    topic: str
    key: bytes
    value: bytes


@dataclass(frozen=True)
class Spooled:
    """A record waiting in the spool; seq orders the spool and names the record for delete()."""

    seq: int
    record: Record


@dataclass(frozen=True)
class Appended:
    kept: int
    dropped: int  # the newest records of the batch, past max_events


class UsageSpool:
    """Append, read the oldest, delete what was acknowledged; count() is what waits."""

    def __init__(self, path: Path, conn: sqlite3.Connection, lock_fd: int, max_events: int) -> None:
        self.path = path
        self._conn = conn
        self._lock_fd = lock_fd
        self.max_events = max_events
        (self._count,) = conn.execute("SELECT count(*) FROM records").fetchone()

    @classmethod
    def open(cls, path: Path, max_events: int) -> UsageSpool:
        """Open (or create) the spool at path, with what a previous run left in it; SpoolInUse if another
        process has it open."""
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(lock_fd)
            raise SpoolInUse(f"{path} is held by another process: one spool per gateway") from exc
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(_SCHEMA)
            return cls(path, conn, lock_fd, max_events)
        except BaseException:
            os.close(lock_fd)
            raise

    def count(self) -> int:
        return self._count

    def append(self, records: list[Record]) -> Appended:
        """Commit records in order, as one transaction, as many as the bound leaves room for."""
        room = max(0, self.max_events - self._count)
        kept = records[:room]
        if kept:
            with self._transaction():
                self._conn.executemany(
                    "INSERT INTO records (topic, key, value) VALUES (?, ?, ?)",
                    [(r.topic, r.key, r.value) for r in kept],
                )
            self._count += len(kept)
        return Appended(len(kept), len(records) - len(kept))

    def oldest(self, limit: int) -> list[Spooled]:
        rows = self._conn.execute(
            "SELECT seq, topic, key, value FROM records ORDER BY seq LIMIT ?", (limit,)
        ).fetchall()
        return [Spooled(seq, Record(topic, bytes(key), bytes(value))) for seq, topic, key, value in rows]

    def delete(self, seqs: list[int]) -> None:
        """Forget these records (acknowledged by the broker); unknown seqs are ignored."""
        if not seqs:
            return
        with self._transaction():
            cur = self._conn.executemany("DELETE FROM records WHERE seq = ?", [(s,) for s in seqs])
        self._count -= cur.rowcount

    def checkpoint(self) -> None:
        """Move what the write-ahead log holds into the file (sqlite also does this as it goes)."""
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        """Close; a spool closed empty leaves no file behind (the lock is still held while they go)."""
        self._conn.close()
        if self._count == 0:
            for suffix in ("", "-wal", "-shm", ".lock"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        os.close(self._lock_fd)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT; a failure (a full disk at COMMIT included) rolls back."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
