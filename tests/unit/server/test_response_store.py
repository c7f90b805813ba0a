"""The local Responses LRU: record and byte bounds, recency, deletion and capacity errors."""

from __future__ import annotations

import json
import random

import pytest

from ninfer.protocol.errors import ProtocolError
from ninfer.server.response_store import ResponseStore, StoreCapacityError, record_size


def put(store: ResponseStore, response_id: str, pad: int = 0) -> None:
    store.put({"id": response_id, "pad": "x" * pad}, [], [], preserve_thinking=False)


def size_of(response_id: str, pad: int = 0) -> int:
    return record_size({"id": response_id, "pad": "x" * pad}, [], [])


def test_record_bound_evicts_least_recently_used() -> None:
    store = ResponseStore(max_records=2, max_bytes=1 << 20)
    put(store, "a")
    put(store, "b")
    store.get("a")  # a is now newer than b
    put(store, "c")
    assert "b" not in store and "a" in store and "c" in store and len(store) == 2


def test_byte_bound_evicts_until_the_new_record_fits() -> None:
    one = size_of("a", 100)
    store = ResponseStore(max_records=100, max_bytes=2 * one + 1)
    put(store, "a", 100)
    put(store, "b", 100)
    put(store, "c", 100)
    assert "a" not in store and len(store) == 2 and store.num_bytes == 2 * one


def test_record_size_is_the_compact_json_length() -> None:
    response, items, history = {"id": "r", "é": 1}, [{"a": [1, 2]}], [{"b": None}]
    text = json.dumps([response, items, history], separators=(",", ":"))
    assert record_size(response, items, history) == len(text.encode())


def test_a_record_larger_than_the_store_fails_without_evicting() -> None:
    store = ResponseStore(max_records=10, max_bytes=size_of("a", 50))
    put(store, "a", 50)
    with pytest.raises(StoreCapacityError) as info:
        put(store, "big", 51)
    assert info.value.code == "response_store_capacity_exceeded" and info.value.status == 400
    assert "a" in store and "big" not in store


def test_missing_and_deleted_ids_are_not_found() -> None:
    store = ResponseStore()
    put(store, "a")
    assert store.delete("a") is True and store.delete("a") is False
    with pytest.raises(ProtocolError) as info:
        store.get("a")
    assert info.value.status == 404 and info.value.code == "response_not_found"


def test_re_storing_an_id_replaces_it_and_keeps_accounting_exact() -> None:
    store = ResponseStore(max_records=5, max_bytes=1 << 20)
    put(store, "a", 10)
    put(store, "a", 30)
    assert len(store) == 1 and store.num_bytes == size_of("a", 30)


def test_random_operations_match_a_reference_lru() -> None:
    rng = random.Random(7)
    max_records, max_bytes = 4, 600
    store = ResponseStore(max_records, max_bytes)
    reference: list[tuple[str, int]] = []  # oldest first: (id, bytes)
    for step in range(400):
        op = rng.random()
        rid = f"r{rng.randrange(8)}"
        if op < 0.5:
            pad = rng.randrange(0, 250)
            num_bytes = size_of(rid, pad)
            reference = [r for r in reference if r[0] != rid]
            while reference and (
                len(reference) >= max_records
                or sum(b for _, b in reference) + num_bytes > max_bytes
            ):
                reference.pop(0)
            reference.append((rid, num_bytes))
            put(store, rid, pad)
        elif op < 0.8:
            present = any(r[0] == rid for r in reference)
            if present:
                entry = next(r for r in reference if r[0] == rid)
                reference.remove(entry)
                reference.append(entry)
                assert store.get(rid).response["id"] == rid
            else:
                with pytest.raises(ProtocolError):
                    store.get(rid)
        else:
            reference = [r for r in reference if r[0] != rid]
            store.delete(rid)
        assert [r[0] for r in reference] == list(store._records), step
        assert store.num_bytes == sum(b for _, b in reference)
        assert len(store) <= max_records and store.num_bytes <= max_bytes


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ResponseStore(max_records=0)
