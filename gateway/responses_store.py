"""The responses kept for `GET /v1/responses/{id}` and `previous_response_id`: a bounded LRU in memory.

Each entry holds the Response object as the client saw it and the conversation
it ends (its input and output as chat messages, without its instructions, which
OpenAI does not carry over), so a follow-up needs no walk up a chain of
entries. At most `--responses-store-size` entries are kept; the least recently
used one goes first. The store lives in one gateway process: with several
gateways behind a balancer, a follow-up must reach the gateway that answered.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.protocol import ChatMessageIn


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]
    conversation: tuple[ChatMessageIn, ...]


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
