"""Stored responses for `previous_response_id` and `GET /v1/responses/{id}`: a bounded in-memory LRU.

Each entry holds the response object and the whole conversation that led to it (every input item of the
chain, the previous outputs included), so a follow-up needs only its own entry: evicting an older response
never breaks a newer one. The price is that a long chain is stored once per turn; the byte bound (the JSON
size of what is kept) caps that. Nothing survives a restart, as with any in-memory cache.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("v4serve.server")

MAX_RESPONSES = 1000  # entries
MAX_BYTES = 64 * 2**20  # JSON bytes of all entries together


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object, output items included
    input_items: list[dict[str, Any]]  # the full conversation before this response's output
    size: int

    def conversation(self) -> list[dict[str, Any]]:
        """What a follow-up request continues: the input, then this response's output."""
        return [*self.input_items, *self.response.get("output", [])]


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> None:
        size = len(json.dumps(response, ensure_ascii=False)) + len(json.dumps(input_items, ensure_ascii=False))
        if size > self.max_bytes:
            log.warning("response %s (%d bytes) is larger than the response store (%d bytes); not stored",
                        response["id"], size, self.max_bytes)
            return
        self.delete(response["id"])
        self._entries[response["id"]] = StoredResponse(response, input_items, size)
        self.bytes += size
        while len(self._entries) > self.max_responses or self.bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.size

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)  # a conversation in use stays
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self.bytes -= entry.size
        return entry is not None
