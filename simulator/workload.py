"""Arrival processes: where a run's arrival times come from (capacity: :mod:`simulator.capacity`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.arrivals import poisson_offsets, read_timestamps_csv, rescale_to_rate
from core.io import shareable_path
from core.trace import Trace
from simulator.stepclock import step_arrivals


@dataclass(frozen=True)
class ArrivalSpec:
    """Where arrival times come from.

    Rate-driven (scaled to ``--load`` x capacity): ``poisson``, ``trace`` (the trace's own times,
    stretched), a CSV file of timestamps. As recorded (no load, no capacity): ``recorded`` (each
    request at its own ``arrival_s`` minus the first, unscaled; ties in row order), ``closed:N``
    (closed loop: N requests in flight, the next submitted when one finishes; ``closed`` alone
    takes N from the recording's metadata) and ``steps`` (the step clock: each request at its
    ``arrival_step``, unit-time steps; :mod:`simulator.stepclock`).
    """

    kind: str = "poisson"
    csv_path: Path | None = None
    window: int | None = None   # closed loop: requests in flight (None: the recording's own)

    def __post_init__(self) -> None:
        if self.kind not in ("poisson", "trace", "csv", "recorded", "closed", "steps"):
            raise ValueError(f"unknown arrival kind {self.kind!r}")
        if self.window is not None and (self.kind != "closed" or self.window < 1):
            raise ValueError(f"--arrivals closed:N needs N >= 1, got {self.window}")

    @classmethod
    def parse(cls, text: str) -> ArrivalSpec:
        if text in ("poisson", "trace", "recorded", "closed", "steps"):
            return cls(text)
        if text.startswith("closed:"):
            raw = text[len("closed:"):]
            try:
                window = int(raw)
            except ValueError:
                raise ValueError(f"--arrivals {text!r}: expected closed:N with N an integer >= 1") from None
            if window < 1:
                raise ValueError(f"--arrivals {text!r}: closed loop needs N >= 1 requests in flight")
            return cls("closed", window=window)
        path = Path(text)
        if path.suffix.lower() != ".csv":
            raise ValueError(f"--arrivals {text!r}: expected 'poisson', 'trace', 'recorded', 'closed[:N]', 'steps' "
                             "or a .csv file of timestamps")
        if not path.is_file():
            raise ValueError(f"--arrivals {text}: no such file")
        return cls("csv", path)

    @property
    def as_recorded(self) -> bool:
        """Replayed as recorded: no load multiple, no capacity measured."""
        return self.kind in ("recorded", "closed", "steps")

    @property
    def step_clock(self) -> bool:
        """Arrivals in engine steps, every step 1.0 (docs/semantics.md "Step clock")."""
        return self.kind == "steps"

    def describe(self) -> str:
        if self.kind == "csv" and self.csv_path is not None:
            return shareable_path(self.csv_path)
        if self.kind == "closed" and self.window is not None:
            return f"closed:{self.window}"
        return self.kind


def recorded_arrivals(workload: Trace) -> np.ndarray:
    """``--arrivals recorded``: each request at its own ``arrival_s`` minus the first, unscaled.

    Equal times are fine (a batch recorded at t=0); the engine breaks ties by row order."""
    own = workload.arrival_s
    if own is None:
        raise ValueError(f"--arrivals recorded: trace {workload.name!r} has no recorded arrival_s "
                         "(a batch recording replays with --arrivals closed:N)")
    return own - float(own.min()) if len(own) else own


def make_arrivals(spec: ArrivalSpec, workload: Trace, rate: float | None, seed: int) -> np.ndarray:
    """Arrival offsets (s) for every request of ``workload`` at mean ``rate`` req/s (closed loop:
    all at 0, the engine releases them ``window`` at a time)."""
    n = len(workload)
    if spec.kind == "recorded":
        return recorded_arrivals(workload)
    if spec.kind == "closed":
        return np.zeros(n)
    if spec.kind == "steps":
        return step_arrivals(workload)
    if rate is None:
        raise ValueError(f"--arrivals {spec.kind} needs an arrival rate")
    if spec.kind == "poisson":
        return poisson_offsets(n, rate, seed)
    if spec.kind == "trace":
        own = workload.arrival_s
        if own is None:
            raise ValueError(f"--arrivals trace: trace {workload.name!r} has no recorded arrival_s")
        if n == 1:
            return np.zeros(1)
        if own.max() == own.min():
            raise ValueError(f"--arrivals trace: trace {workload.name!r} has all arrival_s equal (a batch at one "
                             "instant), nothing to stretch to a rate; use --arrivals recorded or closed:N")
        # rescale in time order, then give each request its own (rescaled) time back
        order = np.argsort(own, kind="stable")
        out = np.empty(n)
        out[order] = rescale_to_rate(own[order] - own.min(), n, rate)
        return out
    assert spec.csv_path is not None   # the only kind left is csv, which always has its path
    return rescale_to_rate(read_timestamps_csv(spec.csv_path), n, rate)
