"""The responses kept for `GET /v1/responses/{id}` and `previous_response_id`: a bounded LRU.

Each entry holds the Response object as the client saw it and the conversation
it ends (its input and output as chat messages, without its instructions, which
OpenAI does not carry over), so a follow-up needs no walk up a chain of
entries. At most `--responses-store-size` entries are kept; the least recently
used one goes first.

`ResponseStore` lives in one gateway process's memory. `SharedResponseStore` keeps
the same LRU in an SQLite file (`--responses-store-file`) that every gateway
process naming it shares: `turnout serve --api-server-count N` gives its N
gateways one, because the kernel hands each connection to any of them, so a
follow-up rarely reaches the process that answered. Several gateways on separate
machines behind a balancer still need the follow-up to reach the one that answered.
"""

from __future__ import annotations

import json
import sqlite3
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import TypeAdapter

from gateway.protocol import ChatMessageIn

_CONVERSATION = TypeAdapter(tuple[ChatMessageIn, ...])
# Seconds an SQLite call waits for another gateway's write to finish (each holds it for well under
# a millisecond) before it fails.
_BUSY_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]
    conversation: tuple[ChatMessageIn, ...]


class ResponseStoreLike(Protocol):
    def __len__(self) -> int: ...

    def put(self, response: dict[str, Any], conversation: Sequence[ChatMessageIn]) -> None: ...

    def get(self, response_id: str) -> StoredResponse | None: ...

    def delete(self, response_id: str) -> bool: ...


class ResponseStore:
    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response: dict[str, Any], conversation: Sequence[ChatMessageIn]) -> None:
        if self._capacity == 0:
            return
        self._entries[response["id"]] = StoredResponse(response, tuple(conversation))
        self._entries.move_to_end(response["id"])
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None


class SharedResponseStore:
    """The LRU in an SQLite file several processes use at once. `used` orders the entries: each put
    or get gives its entry the next number, and a put drops all but the `capacity` highest.

    The file is a cache of recent answers, not a record: it is written without waiting for the disk
    (`synchronous=OFF`, WAL), so an entry may be lost if the machine (not a process) goes down."""

    def __init__(self, path: Path, capacity: int) -> None:
        self._capacity = capacity
        try:
            # autocommit: each statement is its own transaction; the multi-statement ones say BEGIN.
            self._db = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=OFF")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS responses "
                "(id TEXT PRIMARY KEY, used INTEGER NOT NULL, response TEXT NOT NULL, conversation TEXT NOT NULL)"
            )
            self._db.execute("CREATE INDEX IF NOT EXISTS responses_used ON responses (used)")
        except sqlite3.Error as exc:  # a missing folder, a directory, a file that is not SQLite's
            raise ValueError(f"--responses-store-file {path}: {exc}") from None

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def put(self, response: dict[str, Any], conversation: Sequence[ChatMessageIn]) -> None:
        if self._capacity == 0:
            return
        text = json.dumps(response, ensure_ascii=False)
        messages = _CONVERSATION.dump_json(tuple(conversation), exclude_unset=True).decode()
        with self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, (SELECT COALESCE(MAX(used), 0) + 1 FROM responses), ?, ?)",
                (response["id"], text, messages),
            )
            self._db.execute(
                "DELETE FROM responses WHERE used <= (SELECT used FROM responses ORDER BY used DESC LIMIT 1 OFFSET ?)",
                (self._capacity,),
            )

    def get(self, response_id: str) -> StoredResponse | None:
        with self._transaction():
            row = self._db.execute(
                "SELECT response, conversation FROM responses WHERE id = ?", (response_id,)
            ).fetchone()
            if row is None:
                return None
            self._db.execute(
                "UPDATE responses SET used = (SELECT MAX(used) + 1 FROM responses) WHERE id = ?", (response_id,)
            )
        return StoredResponse(json.loads(row[0]), _CONVERSATION.validate_json(row[1]))

    def delete(self, response_id: str) -> bool:
        return self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

    def close(self) -> None:
        self._db.close()

    def _transaction(self) -> sqlite3.Connection:
        # BEGIN IMMEDIATE takes the write lock at once: two gateways numbering `used` never race.
        self._db.execute("BEGIN IMMEDIATE")
        return self._db
