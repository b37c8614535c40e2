"""A fleet replica's request table that keeps the fleet's accounting (routers/snapshot.py) current.

:class:`AccountedTable` is the engine's :class:`simulator.requests.RequestTable` with the events
that move a router's counters reported as they happen: a step's tokens landing (:meth:`land`),
estimates published (:meth:`set_predictions`), requests finishing (:meth:`retire`) and the
residents changing (``resident``: prompts completed, finishes, preemptions). The reference fleet
(simulator/fleet.py) gives each replica one; the compiled kernel writes the arrays in place, so the
compiled fleet derives the same counters from :func:`replica_work` instead.
"""

from __future__ import annotations

import numpy as np

from core.attributes import defaults
from core.trace import Trace
from routers.snapshot import ReplicaAccounting, WorkSum, work_sum
from simulator.requests import RequestTable


def replica_work(table: RequestTable, rows: np.ndarray, estimates: np.ndarray, route_estimate: np.ndarray,
                 predicted: bool = True, true: bool = True) -> WorkSum:
    """The work of local ``rows``: each one's own estimate once published (``ready_s`` set), else
    its routing estimate; the true lengths for the true work. Either part may be skipped (zero)."""
    if not len(rows):
        return WorkSum()
    generated = table.generated[rows]
    if not predicted:   # the true work alone (integers): what the balance and oracle-work read
        return WorkSum(true=int(np.maximum(table.length[rows] - generated, 1).sum()) if true else 0)
    est = np.where(np.isnan(table.ready_s[rows]), route_estimate[rows], estimates[rows])
    return work_sum(est, generated, table.length[rows] if true else None)


class AccountedTable(RequestTable):
    """A replica's table reporting to the fleet's :class:`ReplicaAccounting` (replica ``index``).
    ``events`` False (the compiled fleet, whose kernel writes the arrays in place): only routings
    are reported; the fleet recounts the rest from the table."""

    _accounting: ReplicaAccounting | None = None
    _resident: np.ndarray

    def __init__(self, workload: Trace, arrival: np.ndarray, accounting: ReplicaAccounting, index: int,
                 events: bool = True, predicted: bool = True):
        super().__init__(workload, arrival, None)
        self.attributes = defaults(self.n)   # filled row by row as requests are routed here
        self.route_estimate = np.zeros(self.n, dtype=np.float64)   # per local row, made at routing
        self._fleet, self._index = accounting, index
        self._accounting = accounting if events else None
        self._predicted = predicted   # keep predicted work (a router reads it); the true work is always kept

    @property
    def resident(self) -> np.ndarray:
        return self._resident

    @resident.setter
    def resident(self, rows: np.ndarray) -> None:
        self._resident = rows
        if self._accounting is not None:
            self._accounting.set_running(self._index, len(rows))

    def _work(self, rows: np.ndarray) -> WorkSum:
        return replica_work(self, rows, self.predicted, self.route_estimate, self._predicted)

    def routed(self, row: int) -> None:
        """Local row ``row`` was just routed here (its arrival, prompt, length and routing estimate set)."""
        self._fleet.route(self._index, self._work(np.array([row])))

    def set_predictions(self, rows: np.ndarray, values: np.ndarray, now: float) -> None:
        if not self._predicted or self._accounting is None:   # estimates move only predicted work
            super().set_predictions(rows, values, now)
            return
        live = rows[np.isnan(self.finish_s[rows])]
        before = self._work(live)
        super().set_predictions(rows, values, now)
        self._changed(before, live)

    def land(self, step: int, tick: int, start: float, end: float, chosen: np.ndarray, n_forced: int,
             admit: np.ndarray, first: np.ndarray, prefill_tokens: int, resumed: np.ndarray | None = None) -> np.ndarray:
        moved = np.concatenate([chosen, first] if resumed is None else [chosen, first, resumed])
        before = self._work(moved)
        done = super().land(step, tick, start, end, chosen, n_forced, admit, first, prefill_tokens, resumed)
        self._changed(before, moved)
        return done

    def retire(self, done: np.ndarray, first: np.ndarray, end: float, keep_row_order: bool) -> None:
        if len(done) and self._accounting is not None:
            self._accounting.finish(self._index, len(done), self._work(done))
        super().retire(done, first, end, keep_row_order)

    def _changed(self, before: WorkSum, rows: np.ndarray) -> None:
        if self._accounting is not None and len(rows):
            self._accounting.change(self._index, before, self._work(rows))
