"""The step clock (docs/semantics.md, "Step clock"): a step-clocked serving run as simulator input.

A step-clocked run (``leap-serve --clock steps``) numbers engine ticks 0, 1, 2, ...; each request
has an integer ``arrival_step`` and is in the waiting queue when that tick schedules. ``simulate
--arrivals steps`` replays it with unit-time steps: a request arrives at time ``arrival_step``, a
step lasts exactly 1.0, so the clock at a step's start is its tick.
"""

from __future__ import annotations

import numpy as np

from core.trace import Trace

CLOCKS = ("steps", "seconds")
ARRIVAL_STEP = "arrival_step"
#: the per-request step columns of a step-clocked serving trace (also in every requests.parquet, less arrival)
STEP_COLUMNS = (ARRIVAL_STEP, "admit_step", "first_token_step", "finish_step")


def trace_clock(trace: Trace) -> str:
    """A serving run's arrival clock: metadata ``serving.clock``, absent = ``seconds`` (runs before the
    step clock); a batch recording has none (``seconds``)."""
    serving = (trace.metadata or {}).get("serving")
    clock = serving.get("clock", "seconds") if isinstance(serving, dict) else "seconds"
    if clock not in CLOCKS:
        raise ValueError(f"trace {trace.name!r}: serving.clock {clock!r} is not one of {', '.join(CLOCKS)}")
    return clock


def step_column(trace: Trace, name: str) -> np.ndarray:
    """An integer step column of ``trace`` as int64, refused (naming the column and the first bad
    row) when missing, not integer, null or negative."""
    import pyarrow as pa

    if name not in trace.table.column_names:
        raise ValueError(f"trace {trace.name!r} has no {name} column (not a step-clocked run: "
                         "record one with leap-serve --clock steps)")
    col = trace.table.column(name)
    if not pa.types.is_integer(col.type):
        raise ValueError(f"trace {trace.name!r}: column {name}: expected integer steps, found {col.type}")
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"trace {trace.name!r}: column {name}: row {row}: null step")
    values = col.to_numpy().astype(np.int64)
    if (values < 0).any():
        row = int(np.flatnonzero(values < 0)[0])
        raise ValueError(f"trace {trace.name!r}: column {name}: row {row}: step {values[row]} is negative")
    return values


def step_arrivals(trace: Trace) -> np.ndarray:
    """``--arrivals steps``: each request at its ``arrival_step`` (unshifted: the simulated steps keep
    the run's numbering), as float64 times of the unit-time clock."""
    clock = trace_clock(trace)
    if clock != "steps" and "serving" in (trace.metadata or {}):
        raise ValueError(f"--arrivals steps: trace {trace.name!r} is a {clock}-clocked serving run "
                         "(serving.clock); replay it with --arrivals recorded")
    return step_column(trace, ARRIVAL_STEP).astype(np.float64)
