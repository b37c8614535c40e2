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
