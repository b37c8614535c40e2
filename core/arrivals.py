"""Arrival-time inputs shared by the simulator and live serving runs: a load given as a multiple
of capacity (``1.5x``), and a CSV of recorded timestamps stretched to a target rate."""

from __future__ import annotations

import csv
import re
from datetime import datetime
from pathlib import Path

import numpy as np

from core.rows import check_times

LOAD_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*[xX]?\s*$")


def parse_load(text: str) -> float:
    """``1.5x`` (or ``1.5``) -> 1.5; a positive, finite multiple of capacity."""
    match = LOAD_PATTERN.match(str(text))
    if not match:
        raise ValueError(f"--load {text!r}: expected a positive multiple of capacity such as 1.5x")
    value = float(match.group(1))
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"--load {text!r}: must be a positive multiple of capacity")
    return value


def read_timestamps_csv(path: Path) -> np.ndarray:
    """Seconds from the first row of a CSV with a TIMESTAMP (date-time) or arrival_s/timestamp column."""
    try:
        with open(path, newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if not header:
                raise ValueError(f"--arrivals {path}: empty CSV")
            lowered = [h.strip().lower() for h in header]
            for name in ("timestamp", "arrival_s", "arrival_time", "time"):
                if name in lowered:
                    col = lowered.index(name)
                    break
            else:
                raise ValueError(f"--arrivals {path}: no TIMESTAMP or arrival_s column (header: {', '.join(header)})")
            raw = [row[col] for row in reader if len(row) > col and row[col].strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--arrivals {path}: cannot read ({exc})") from None
    if len(raw) < 2:
        raise ValueError(f"--arrivals {path}: needs at least two timestamps")
    try:
        values = np.array([float(v) for v in raw])
    except ValueError:   # date-times: seconds from the first row
        try:
            stamps = [datetime.fromisoformat(v.strip()[:26]) for v in raw]
        except ValueError as exc:
            raise ValueError(f"--arrivals {path}: unparseable timestamp ({exc})") from None
        values = np.array([(s - stamps[0]).total_seconds() for s in stamps])
    else:   # numbers are seconds from the trace's start: a negative one is a misread value
        check_times(f"--arrivals {path}", header[col].strip(), values, error=ValueError)
    values = np.sort(values - values.min())
    if values[-1] <= 0:
        raise ValueError(f"--arrivals {path}: all timestamps are equal")
    return values


def rescale_to_rate(times: np.ndarray, n: int, rate: float) -> np.ndarray:
    """The first ``n`` arrivals of ``times`` (gaps tiled if too few), stretched to a mean rate."""
    gaps = np.diff(times)
    if len(gaps) < n - 1:
        gaps = np.tile(gaps, int(np.ceil((n - 1) / len(gaps))))
    gaps = gaps[: max(n - 1, 0)]
    if n > 1 and gaps.sum() <= 0:
        raise ValueError("arrival timestamps span zero time; cannot rescale")
    out = np.concatenate([[0.0], np.cumsum(gaps)])
    if n > 1:
        out *= (n - 1) / rate / out[-1]
    return out[:n]


def poisson_offsets(n: int, rate: float, seed: int) -> np.ndarray:
    """The project's one Poisson arrival process: ``n`` offsets, the first at 0, exponential gaps
    of mean ``1 / rate`` drawn from ``default_rng(seed)`` (same seed and rate -> same offsets, in
    seconds or in engine steps alike)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def poisson_steps(n: int, rate_per_step: float, seed: int) -> np.ndarray:
    """Step-clock arrivals: :func:`poisson_offsets` in steps, floored to whole step indices."""
    return np.floor(poisson_offsets(n, rate_per_step, seed)).astype(np.int64)


def read_steps_csv(path: Path) -> np.ndarray:
    """Step indices (int64, sorted) from a CSV's ``arrival_step`` column: whole numbers >= 0."""
    try:
        with open(path, newline="") as fh:
            reader = csv.reader(fh)
            header = [h.strip().lower() for h in next(reader, None) or []]
            if "arrival_step" not in header:
                raise ValueError(f"--arrivals {path}: no arrival_step column (header: {', '.join(header)})")
            col = header.index("arrival_step")
            raw = [(line, row[col].strip()) for line, row in enumerate(reader, start=2)
                   if len(row) > col and row[col].strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--arrivals {path}: cannot read ({exc})") from None
    if not raw:
        raise ValueError(f"--arrivals {path}: column arrival_step is empty")
    steps = []
    for line, text in raw:
        if not re.fullmatch(r"\+?[0-9]+", text):
            raise ValueError(f"--arrivals {path}: column arrival_step: line {line}: {text!r} is not a "
                             "whole step index >= 0")
        steps.append(int(text))
    if max(steps) >= 2**62:
        raise ValueError(f"--arrivals {path}: column arrival_step: {max(steps)} is out of range")
    return np.sort(np.array(steps, dtype=np.int64), kind="stable")
