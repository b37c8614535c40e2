"""A compiled fleet's replica tables sized for what each replica holds, grown as rows are routed to it.

A replica's table starts at :func:`first_capacity` rows (its even share of the workload plus an
eighth, not the whole workload) and, when the fleet's next arrival instant brings more rows than a
replica has room for, is grown (:func:`grow_replica`) to twice its size (at most the workload's
size), between kernel calls: every per-row array of the table (:data:`ROW_COLUMNS`), the replica's
global rows, and the kernel's per-row arrays (:class:`simulator.kernel_layout.Rows`, the row-sized
:class:`simulator.kernel_layout.Work` arrays) are copied into arrays of the new size, the new rows
at the values a fresh table holds. Nothing a run computes depends on a table's size (rows not yet
routed never arrive: their arrival is +inf), so the outputs are the same bytes.
"""

from __future__ import annotations

import numpy as np

#: the per-row arrays of a fleet replica's table (simulator/requests.py RequestTable, and the
#: fleet's AccountedTable's routing estimates); tests/test_replica_growth.py checks that a fresh
#: table has no other array of its size
ROW_COLUMNS = ("arrival", "prompt", "prompt_sq", "length", "generated", "predicted", "first_predicted", "ready_s",
               "admit_s", "first_token_s", "finish_s", "admit_step", "first_token_step", "finish_step",
               "last_served", "forced_steps", "admitted", "prefilled", "preemptions", "route_estimate")
#: the kernel's working arrays with a slot per row (simulator/compiled.py CompiledRun._work_arrays)
WORK_ROWS = ("lru_prev", "lru_next", "heap_keys", "heap_rows", "fb_rows", "fb_ends")
SLACK = 8   # a replica's first table holds its even share plus 1/SLACK of it


def first_capacity(n: int, replicas: int) -> int:
    """Rows of a replica's first table: its even share of ``n`` plus an eighth (and 64), at most ``n``."""
    share = -(-n // replicas)
    return min(n, share + share // SLACK + 64)


def next_capacity(capacity: int, needed: int, n: int) -> int:
    """The size a table of ``capacity`` rows grows to when it must hold ``needed``: doubled, at most ``n``."""
    return min(n, max(2 * capacity, needed))


def _grown(old: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    out = np.empty(len(old) + len(fresh), dtype=old.dtype)
    out[:len(old)] = old
    out[len(old):] = fresh
    return out


def grow_table(table, fresh) -> dict[int, np.ndarray]:
    """``table``'s per-row arrays extended by ``fresh``'s (a new table of the added rows) in place
    (aliases kept: ``fill`` is ``prompt`` until a preemption gives it its own); returns the map
    from each replaced array's id to its replacement."""
    replaced: dict[int, np.ndarray] = {}
    for name in ROW_COLUMNS:
        old = getattr(table, name)
        replaced[id(old)] = new = _grown(old, getattr(fresh, name))
        setattr(table, name, new)
    for name, alias in (("fill", "prompt"), ("fill_sq", "prompt_sq")):
        old = getattr(table, name)
        replaced.setdefault(id(old), _grown(old, getattr(fresh, alias)))
        setattr(table, name, replaced[id(old)])
    attributes = tuple(_grown(a, f) for a, f in zip(table.attributes, fresh.attributes))
    for a, new in zip(table.attributes, attributes):
        replaced[id(a)] = new
    table.attributes = type(table.attributes)(*attributes)
    grew = len(fresh.arrival)
    table.n += grew
    table.released += grew   # a fleet replica's table is not a closed loop: every row is submitted
    return replaced


def grow_replica(replica, run, fresh) -> None:
    """Grow ``replica``'s table (its :class:`simulator.compiled.CompiledRun` ``run``'s too) by the
    rows of ``fresh``: between kernel calls, the run's counters untouched."""
    table = replica.parts.table
    old_n, grew = table.n, len(fresh.arrival)
    predictor = getattr(replica.parts.driver, "predictor", None)
    if predictor is not None:   # a prediction driver starts every row at its predictor's prior
        fresh.predicted[:] = predictor.prior_length
    replaced = grow_table(table, fresh)
    rows = _grown(replica.rows, np.full(grew, -1, dtype=np.int64))
    replaced[id(replica.rows)] = rows
    for holder in (predictor, run.predictor):   # the replica's views of its predictor
        if holder is not None and getattr(holder, "rows", None) is replica.rows:
            holder.rows = rows
    replica.rows = table.source_rows = rows
    if id(run.predicted) not in replaced:   # the run's own estimates (no predictor, or fixed per row)
        replaced[id(run.predicted)] = _grown(run.predicted, np.zeros(grew, dtype=np.float64))
    run.predicted = replaced[id(run.predicted)]
    replica.estimates = run.predicted
    n = table.n
    rekey = np.empty(max(n, len(run.rekey) - 1) + 1, dtype=np.int64)
    rekey[:len(run.rekey)] = run.rekey
    run.rekey = rekey
    fields = {name: replaced[id(value)] for name, value in run.rows._asdict().items()
              if isinstance(value, np.ndarray) and id(value) in replaced}
    fields["attributes"] = table.attributes
    fields["cached"] = _grown(run.rows.cached, np.zeros(grew, dtype=np.int64))
    run.rows = run.rows._replace(**fields)
    work = {name: _grown(getattr(run.work, name), np.empty(grew, dtype=getattr(run.work, name).dtype))
            for name in WORK_ROWS if len(getattr(run.work, name)) == max(old_n, 1)}
    run.work = run.work._replace(rekey=rekey, **work)
    run.kernel_args = (run.rows, run.work, run.settings, run.state, run.batch)
    run.st.released = table.released
    view = replica.parts.scheduler.view   # the Python scheduler's view of the table's arrays
    for name, value in vars(view).items():
        if isinstance(value, np.ndarray) and id(value) in replaced:
            setattr(view, name, replaced[id(value)])
    view.attributes = table.attributes
