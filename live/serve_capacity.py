"""``leap-serve``'s live-capacity cache: ``$LEAP_CACHE_DIR/live_capacity.json``, keyed by the workload and the
engine settings but not the policy (so every policy's loads are multiples of one FCFS capacity)."""

from __future__ import annotations

import hashlib
import json

CAPACITY_FILE = "live_capacity.json"


def capacity_key(desc: dict) -> str:
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:24]


def read_capacity(key: str) -> dict | None:
    from core.io import cache_dir

    f = cache_dir() / CAPACITY_FILE
    try:
        return json.loads(f.read_text()).get(key)
    except (OSError, ValueError):
        return None


def write_capacity(key: str, entry: dict) -> None:
    from core.io import atomic_write_json, cache_dir

    f = cache_dir() / CAPACITY_FILE
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = entry
    atomic_write_json(f, data)
