"""The compiled kernel's step log on the Python side: its arrays grown before each kernel call, then
read into the reference's :class:`simulator.engine.StepLog` (the kernel writes one row per step:
:mod:`simulator.kernel_log`)."""

from __future__ import annotations

import numpy as np

from simulator.kernel_layout import LOG_COLUMNS, Work


def no_log() -> dict[str, np.ndarray]:
    """The log arrays of a run that keeps no log (zero rows)."""
    return {"log_times": np.empty((0, 2), dtype=np.float64),
            "log_counts": np.empty((0, len(LOG_COLUMNS)), dtype=np.int64)}


def with_room(work: Work, steps: int) -> Work:
    """``work`` whose log holds at least ``steps`` rows (doubled when it grows; rows kept)."""
    held = len(work.log_times)
    if held >= steps:
        return work
    rows = max(steps, 2 * held)
    times = np.empty((rows, 2), dtype=np.float64)
    counts = np.empty((rows, len(LOG_COLUMNS)), dtype=np.int64)
    times[:held], counts[:held] = work.log_times, work.log_counts
    return work._replace(log_times=times, log_counts=counts)


def fill_step_log(log, work: Work, steps: int) -> None:
    """Append the kernel's first ``steps`` rows to ``log`` (a :class:`simulator.engine.StepLog`) as
    the reference appends them: Python floats and ints (a first step at time 0 starts at ``env.now``
    before any timeout has fired: the int 0, which makes a one-step log's ``start_s`` int64)."""
    starts = work.log_times[:steps, 0].tolist()
    if starts and starts[0] == 0.0:   # SimPy's clock is the int 0 until a timeout fires (none did)
        starts[0] = 0
    log.start_s.extend(starts)
    log.duration_s.extend(work.log_times[:steps, 1].tolist())
    for j, name in enumerate(LOG_COLUMNS):
        getattr(log, name).extend(work.log_counts[:steps, j].tolist())
