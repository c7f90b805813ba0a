"""The local Responses store: an in-process LRU of terminal Responses, bounded by count and bytes.

Standard library and `protocol.errors` only. Each record is self-contained: it keeps its whole
conversation (parent history + own input + own output Items), so deleting or evicting an ancestor
never breaks a descendant; the price is repeated history, which the byte bound counts honestly.
Size is the record's compact JSON length, measured once at insertion.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ninfer.protocol.errors import ProtocolError

DEFAULT_MAX_RECORDS = 1024
DEFAULT_MAX_MIB = 256


class StoreCapacityError(ProtocolError):
    """One Response is larger than the whole store: it cannot be kept, so it is not pretended."""

    def __init__(self, num_bytes: int, max_bytes: int) -> None:
        super().__init__(
            f"the Response needs {num_bytes} bytes of local state, more than the store's "
            f"capacity of {max_bytes} bytes (--response-store-max-mib)",
            status=400,
            code="response_store_capacity_exceeded",
            param="store",
        )


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the terminal wire object
    input_items: list[dict[str, Any]]  # the Items supplied to that request (normalized)
    history: list[dict[str, Any]]  # the whole conversation: what a child continues from
    preserve_thinking: bool
    num_bytes: int


def record_size(response: dict[str, Any], input_items: list[Any], history: list[Any]) -> int:
    return len(json.dumps([response, input_items, history], separators=(",", ":")).encode())


class ResponseStore:
    """LRU by last use (store, retrieve, continue); `put` evicts the oldest until bounds hold."""

    def __init__(
        self, max_records: int = DEFAULT_MAX_RECORDS, max_bytes: int = DEFAULT_MAX_MIB << 20
    ):
        if max_records < 1 or max_bytes < 1:
            raise ValueError("the response store needs at least one record and one byte")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._records

    def check_fits(self, num_bytes: int) -> None:
        if num_bytes > self.max_bytes:
            raise StoreCapacityError(num_bytes, self.max_bytes)

    def put(
        self,
        response: dict[str, Any],
        input_items: list[dict[str, Any]],
        history: list[dict[str, Any]],
        *,
        preserve_thinking: bool,
    ) -> StoredResponse:
        num_bytes = record_size(response, input_items, history)
        self.check_fits(num_bytes)
        response_id = response["id"]
        self.delete(response_id)
        while self._records and (
            len(self._records) >= self.max_records or self.num_bytes + num_bytes > self.max_bytes
        ):
            _, evicted = self._records.popitem(last=False)
            self.num_bytes -= evicted.num_bytes
        record = StoredResponse(response, input_items, history, preserve_thinking, num_bytes)
        self._records[response_id] = record
        self.num_bytes += num_bytes
        return record

    def get(self, response_id: str, *, param: str = "response_id") -> StoredResponse:
        """The record (now most recently used), or 404 response_not_found naming `param`."""
        record = self._records.get(response_id)
        if record is None:
            raise not_found(response_id, param)
        self._records.move_to_end(response_id)
        return record

    def delete(self, response_id: str) -> bool:
        record = self._records.pop(response_id, None)
        if record is None:
            return False
        self.num_bytes -= record.num_bytes
        return True


def not_found(response_id: str, param: str = "response_id") -> ProtocolError:
    return ProtocolError(
        f"no stored Response with id {response_id!r} (never stored, store:false, not finished "
        "yet: a Response is stored when it ends, evicted or deleted)",
        status=404,
        code="response_not_found",
        param=param,
    )
