"""``leap-serve``'s live-capacity cache: ``$LEAP_CACHE_DIR/live_capacity.json`` (``core.capacity_cache``),
keyed by the workload and the engine settings but not the policy (so every policy's loads are
multiples of one FCFS capacity)."""

from __future__ import annotations

from core.capacity_cache import cache_key, cache_path, read_entry, write_entry

CAPACITY_FILE = "live_capacity.json"


def capacity_key(desc: dict) -> str:
    return cache_key(desc, length=24)


def read_capacity(key: str) -> dict | None:
    return read_entry(cache_path(CAPACITY_FILE), key)


def write_capacity(key: str, entry: dict) -> None:
    write_entry(cache_path(CAPACITY_FILE), key, entry)
