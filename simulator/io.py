"""Atomic file writes and the on-disk cache: a crash never leaves a half-written file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def cache_dir() -> Path:
    """``$LEAP_CACHE_DIR`` or ``~/.cache/leap-sched``; created on first use."""
    root = Path(os.environ.get("LEAP_CACHE_DIR") or Path.home() / ".cache" / "leap-sched")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _atomic(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    _atomic(path, lambda fh: fh.write(data))


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode())


def atomic_write_parquet(path: Path, table: pa.Table) -> None:
    _atomic(path, lambda fh: pq.write_table(table, fh, compression="zstd"))
