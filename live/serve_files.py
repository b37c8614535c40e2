"""The files a leap-serve run writes beside its rows, in one place for both modes (in process and
``--server``) and for the plugin's settings endpoint: files named by content, JSON written whole."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from core.io import atomic_write_bytes


def file_ref(path: str | None) -> str | None:
    """A file by name and content hash: no machine path in shared metadata."""
    if path is None:
        return None
    p = Path(path)
    return f"{p.name}@sha256:{hashlib.sha256(p.read_bytes()).hexdigest()[:12]}"


def write_json(path: Path, obj) -> None:
    """Written whole or not at all: a crash never leaves half a record for a resume to read."""
    atomic_write_bytes(path, json.dumps(obj).encode())
