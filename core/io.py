"""Atomic file writes (the project's one writer: a temporary file in the target's folder, fsync,
rename), the on-disk cache, where the shared data lives, and how input files are named in outputs
meant to be shared (never by an absolute path)."""

from __future__ import annotations

import functools
import hashlib
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


#: The repository checkout (an editable install's source folder).
CHECKOUT = Path(__file__).resolve().parent.parent
DATA_DIR_ENV = "LEAP_DATA_DIR"


class DataDirMissing(ValueError):
    """Neither ``$LEAP_DATA_DIR`` nor ``<checkout>/../shared/data`` is a folder."""


def data_dir() -> Path:
    """The shared data folder (prompt sets, arrival traces): ``$LEAP_DATA_DIR``, else
    ``<checkout>/../shared/data``. Raises :class:`DataDirMissing` (one line naming both) if absent."""
    env = os.environ.get(DATA_DIR_ENV)
    path = Path(env) if env else CHECKOUT.parent / "shared" / "data"
    if not path.is_dir():
        where = f"${DATA_DIR_ENV}={env}" if env else f"{path} (<checkout>/../shared/data)"
        raise DataDirMissing(f"shared data folder not found: {where}; set ${DATA_DIR_ENV} to the folder "
                             f"holding prompts/ and arrivals/, or place it at <checkout>/../shared/data")
    return path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def shareable_path(path: Path | str) -> str:
    """How an input file is named in shared outputs (config.json, results tables, reports): its path
    relative to the current folder when it lies below it, else its file name and the first 12 hex
    digits of its content's sha256 (``NAME@sha256:HEX``). Never an absolute path."""
    p = Path(path)
    try:
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except (ValueError, OSError):
        pass
    try:
        stat = p.stat()
        return f"{p.name}@sha256:{_cached_sha256(str(p.resolve()), stat.st_mtime_ns, stat.st_size)[:12]}"
    except OSError:
        return p.name


@functools.lru_cache(maxsize=64)
def _cached_sha256(path: str, mtime_ns: int, size: int) -> str:
    return file_sha256(Path(path))


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
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            # a full disk or `ulimit -f` ("File too large") names no file by itself
            raise OSError(exc.errno, f"{path}: {exc.strerror or exc}") from None
        raise


#: The names :func:`_atomic` gives its temporary files: ``.TARGET.RANDOM.tmp``.
TEMP_PATTERN = ".*.tmp"


def remove_stale_temps(folder: Path) -> list[Path]:
    """Remove the temporary files a killed writer (``kill -9``, power loss) left in ``folder``; a
    command calls it when it starts writing the same output again, so none survives the next run.
    Returns what was removed."""
    removed = []
    for tmp in sorted(Path(folder).glob(TEMP_PATTERN)):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def atomic_write_bytes(path: Path, data: bytes) -> None:
    _atomic(path, lambda fh: fh.write(data))


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode())


def atomic_write_parquet(path: Path, table: pa.Table, **options) -> None:
    """Parquet, zstd unless ``options`` (``pq.write_table``'s keywords) say otherwise."""
    options = options or {"compression": "zstd"}
    _atomic(path, lambda fh: pq.write_table(table, fh, **options))
