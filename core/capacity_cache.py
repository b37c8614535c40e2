"""The one on-disk capacity cache: a JSON object per file under ``$LEAP_CACHE_DIR``, entry per key,
each entry a dict with a finite positive ``capacity_req_s``. The simulator caches its measured
capacity in ``capacity.json`` (``simulator.capacity``), ``leap-serve`` the live engine's in
``live_capacity.json`` (``live.serve_capacity``); both read and write through here, so an
unreadable file or a bad entry is named the same way (one stderr line, then recomputed) and a
write never loses another process's entries."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

from core.errors import UsageError


def cache_key(desc: dict, length: int = 32) -> str:
    """A stable key for a description (sorted JSON, SHA-256)."""
    return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()[:length]


def cache_path(file_name: str) -> Path:
    from core.io import cache_dir

    return cache_dir() / file_name


def read_table(path: Path, quiet: bool = False) -> dict:
    """The cache file as a dict; a missing file is empty, an unreadable or malformed one is named
    on stderr (unless ``quiet``) and treated as empty (its entries are recomputed and it is
    rewritten whole), never a traceback."""
    if not path.exists():
        return {}
    if path.is_dir():   # nothing can be read or written there: refused, not worked around per run
        raise UsageError(f"capacity cache {path} is a folder, not a file: remove it, or set "
                         "LEAP_CACHE_DIR to another folder")
    try:
        table = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        if not quiet:
            print(f"warning: capacity cache {path} is unreadable ({exc}); recomputing", file=sys.stderr)
        return {}
    if not isinstance(table, dict):
        if not quiet:
            print(f"warning: capacity cache {path} is not a JSON object; recomputing", file=sys.stderr)
        return {}
    return table


#: Above this a cached capacity is not a measurement (one engine completing a billion requests a
#: second): named and recomputed like any other invalid entry.
MAX_CAPACITY_REQ_S = 1e9


def valid_entry(entry) -> bool:
    value = entry.get("capacity_req_s") if isinstance(entry, dict) else None
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 < value <= MAX_CAPACITY_REQ_S and _writable(entry))


def _writable(entry) -> bool:
    """Strict JSON (no NaN or infinity anywhere in it): what :func:`write_entry` can write back."""
    try:
        json.dumps(entry, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def read_entry(path: Path, key: str) -> dict | None:
    """The entry under ``key`` when valid; None when absent, or invalid (named on stderr)."""
    table = read_table(path)
    if key not in table:
        return None
    if valid_entry(table[key]):
        return table[key]
    print(f"warning: capacity cache {path}: entry {key} is invalid ({table[key]!r:.80}); recomputing",
          file=sys.stderr)
    return None


def write_entry(path: Path, key: str, entry: dict) -> None:
    """Add or replace one entry, re-reading the file first (another process may have added some)."""
    from core.io import atomic_write_json

    if not valid_entry(entry):
        raise ValueError(f"capacity cache entry {key}: capacity_req_s must be a finite positive number "
                         f"(at most {MAX_CAPACITY_REQ_S:g})")
    # invalid entries of other keys go (each is recomputed when asked for): one NaN must not make
    # the file unwritable for every run
    table = {k: v for k, v in read_table(path, quiet=True).items() if valid_entry(v)}
    table[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, table)
