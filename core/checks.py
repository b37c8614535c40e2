"""Checks of command-line values shared by every console script, one helper per kind of bad input,
so that each kind is refused the same way everywhere: one line naming the flag (and the value),
before any work starts or anything is written (``core.errors`` turns the error into exit status 2).

- sizes (:func:`bounded_int`): a count or size above what the command can hold is refused before
  anything is allocated, instead of a MemoryError or a run of hours;
- numbers (:func:`finite_float`): NaN and infinity are never a setting;
- lists (:func:`split_list`): an empty comma list (``--predictor ,``) names its flag;
- seeds (:data:`MAX_NUMPY_SEED`): what ``numpy.random.default_rng`` and the int64 results tables take;
- output paths (:func:`output_path`, :func:`check_writable`): an empty path is refused (it would
  write into the current folder), and a place that cannot be written is found before the work.

Nothing heavy is imported here: ``experiments.entry`` may load this before numpy.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

from core.errors import UsageError

#: Largest seed a run may use: results tables store seeds as int64.
MAX_NUMPY_SEED = 2**63 - 1


def bounded_int(minimum: int, maximum: int | None = None, why: str = ""):
    """An argparse ``type`` for an integer in [minimum, maximum]; ``why`` says what the maximum
    protects (shown when it is exceeded)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum:,}{f' ({why})' if why else ''}, got {value:,}")
        return value
    return parse


def finite_float(minimum: float | None = None, maximum: float | None = None):
    """An argparse ``type`` for a finite number, optionally within [minimum, maximum]."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum:g}, got {text!r}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum:g}, got {text!r}")
        return value
    return parse


def split_list(flag: str, text: str) -> list[str]:
    """``a,b`` -> [a, b]; an empty list (``''``, ``,``) is refused naming the flag."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise UsageError(f"{flag}: empty list {text!r}")
    return items


def output_path(text: str) -> Path:
    """An argparse ``type`` for an output path: an empty one is refused (``Path("")`` is the current
    folder, where the command would write unasked)."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError("empty path: name a file or folder")
    return Path(text)


def check_writable(flag: str, path: Path) -> None:
    """Refuse an output path that cannot be written, before the work: a file in the way of a folder,
    or a nearest existing folder the user may not write to. Nothing is created."""
    path = Path(path)
    for parent in [path, *path.parents]:
        if not parent.exists():
            continue
        if parent != path and not parent.is_dir():
            raise UsageError(f"{flag} {path}: {parent} exists and is not a folder")
        folder = parent if parent.is_dir() else parent.parent
        try:   # os.access says yes to root everywhere; an unnamed file tells (and leaves nothing)
            if not os.access(folder, os.W_OK | os.X_OK):
                raise PermissionError(13, "permission denied")
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as exc:
            raise UsageError(f"{flag} {path}: {folder} is not writable ({exc.strerror or exc})") from None
        return


def check_decode_slots(decode_slots: int, max_resident: int, error: type[Exception] = ValueError) -> None:
    """The one rule that ``simulate`` and the live scheduler refuse alike: a decode slot needs a
    resident request. (The engine itself accepts more slots than residents: they just stay idle.)"""
    if decode_slots > max_resident:
        raise error(f"--decode-slots {decode_slots}: decode-slots ({decode_slots}) cannot exceed max-resident "
                    f"({max_resident}): only resident requests decode")


def own_requests_arrivals(trace: str | None, arrivals: str) -> tuple[str | None, str]:
    """``--arrivals FILE.jsonl``: a public trace that carries its requests with its times (Mooncake)
    replays those requests at their own times stretched to ``--load``, i.e. ``--trace FILE
    --arrivals trace`` (a timestamps CSV, by contrast, times another trace's requests)."""
    if not arrivals.lower().endswith((".jsonl", ".json")):
        return trace, arrivals
    if not Path(arrivals).is_file():
        raise UsageError(f"--arrivals {arrivals}: no such file")
    if trace is not None and Path(trace) != Path(arrivals):
        raise UsageError(f"--arrivals {arrivals} carries its own requests (lengths, prefix hashes) and times "
                         f"them; it cannot time --trace {trace}: drop --trace, or give --arrivals a .csv of timestamps")
    return arrivals, "trace"
