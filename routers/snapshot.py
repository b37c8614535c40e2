"""The replicas' accounting: what a router reads of a fleet, kept current as the replicas run.

One :class:`ReplicaAccounting` per fleet run holds per-replica counters (docs/semantics.md "Fleets"):

- ``outstanding``: requests routed to the replica and not finished; ``running`` of them resident
  (prompt complete, not finished); ``waiting`` = outstanding - running (queued, part-prefilled or
  preempted).
- ``predicted_work``: the sum over its unfinished requests of max(estimate - generated tokens, 1),
  the estimate being the replica's own once published, else the routing estimate made at arrival.
- ``true_work``: the same with the true length (oracle routers, and the fleet's balance).
- ``kv_used`` / ``kv_free``: KV blocks held and free; without KV blocks modelled ``kv_used`` is 0
  and ``kv_free`` is -1 (unbounded).

The engines update the counters at the events that move them (a request routed, a step's tokens
landed, estimates published, requests finished, residents preempted): the reference fleet at each
event, the compiled fleet per replica from what its kernel landed since the last routing. Routers
never read the engines' tables, only :meth:`ReplicaAccounting.view` (the fields their ``reads``
names), so both kernels and the live fleet route on the same numbers.

Predicted work is kept exactly (integer tokens plus the fractions in units of 2**-52: every
estimate >= 1 is a multiple of that), so the order in which updates arrive never changes a sum, and
two replicas with equal work tie exactly (ties go to the lowest index).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: fractions of predicted work are counted in units of 2**-52 (exact for every value >= 1)
FRACTION_BITS = 52
_HALF = 26   # fractions are summed in two int64 halves (no overflow below 2**37 rows)


@dataclass(frozen=True)
class WorkSum:
    """An exact sum of max(estimate - generated, 1) over some requests, and of max(length - generated, 1)."""

    whole: int = 0        # integer tokens of predicted work
    units: int = 0        # its fractions, in units of 2**-52
    true: int = 0         # true work (integer tokens)


def work_sum(estimate: np.ndarray, generated: np.ndarray, length: np.ndarray | None) -> WorkSum:
    """The exact work of requests with these estimates, generated tokens and (optionally) true lengths.
    ``estimate - generated`` is exact for every estimate below 2**52, so each term is exact."""
    if not len(estimate):
        return WorkSum()
    term = np.maximum(estimate - generated, 1.0)
    whole = np.floor(term)
    units = ((term - whole) * float(1 << FRACTION_BITS)).astype(np.int64)
    if len(units) < 1 << (63 - FRACTION_BITS):   # no int64 overflow: each unit count is below 2**52
        fraction = int(units.sum())
    else:
        fraction = (int((units >> _HALF).sum()) << _HALF) + int((units & ((1 << _HALF) - 1)).sum())
    true = 0 if length is None else int(np.maximum(length - generated, 1).sum())
    return WorkSum(int(whole.sum()), fraction, true)   # whole tokens sum exactly in float64 (< 2**53)


class ReplicaAccounting:
    """Per-replica counters of one fleet run (length ``replicas`` arrays; see the module's docstring)."""

    def __init__(self, replicas: int, kv_blocks_per_replica: int | None = None):
        self.replicas = replicas
        self.outstanding = np.zeros(replicas, dtype=np.int64)
        self.running = np.zeros(replicas, dtype=np.int64)
        self.true_work = np.zeros(replicas, dtype=np.int64)
        self.kv_total = kv_blocks_per_replica
        self.kv_used = np.zeros(replicas, dtype=np.int64)
        self.kv_free = np.full(replicas, -1 if kv_blocks_per_replica is None else kv_blocks_per_replica,
                               dtype=np.int64)
        self._whole = [0] * replicas     # predicted work, exact: whole tokens ...
        self._units = [0] * replicas     # ... and fractions (2**-52)
        self._predicted = np.zeros(replicas, dtype=np.float64)
        self._stale: set[int] = set()    # replicas whose float predicted work is out of date

    # --- what a router reads -----------------------------------------------------------------------
    @property
    def waiting(self) -> np.ndarray:
        return self.outstanding - self.running

    @property
    def predicted_work(self) -> np.ndarray:
        for i in self._stale:
            self._predicted[i] = self._exact(WorkSum(self._whole[i], self._units[i]))
        self._stale.clear()
        return self._predicted

    @staticmethod
    def _exact(work: WorkSum) -> float:
        """An exact sum rounded once (Python's int division rounds correctly)."""
        return ((work.whole << FRACTION_BITS) + work.units) / (1 << FRACTION_BITS)

    def view(self, reads: str):
        """The :class:`routers.base.FleetView` of a router that reads ``reads`` (only that is filled)."""
        from routers.base import FleetView

        counts = reads in ("outstanding", "prefix", "cache")
        kv = reads in ("kv", "cache")
        return FleetView(
            replicas=self.replicas,
            outstanding=self.outstanding.copy() if counts else None,
            waiting=self.waiting if counts else None,
            running=self.running.copy() if counts else None,
            work=self.predicted_work.copy() if reads == "predicted_work" else None,
            true_work=self.true_work.astype(np.float64) if reads == "true_work" else None,
            kv_used=self.kv_used.copy() if kv else None,
            kv_free=self.kv_free.copy() if kv else None)

    # --- the events that move the counters ---------------------------------------------------------
    def route(self, replica: int, work: WorkSum) -> None:
        """A request joins ``replica`` (its work at generated = 0)."""
        self.outstanding[replica] += 1
        self.add(replica, work)

    def add(self, replica: int, work: WorkSum, sign: int = 1) -> None:
        """Work joins (sign 1) or leaves (sign -1) the replica's unfinished requests."""
        if work.whole or work.units:
            self._whole[replica] += sign * work.whole
            self._units[replica] += sign * work.units
            self._stale.add(replica)
        self.true_work[replica] += sign * work.true

    def change(self, replica: int, before: WorkSum, after: WorkSum) -> None:
        """Requests' work moved (tokens landed, estimates published) from ``before`` to ``after``."""
        self.add(replica, before, -1)
        self.add(replica, after)

    def finish(self, replica: int, count: int, work: WorkSum) -> None:
        """``count`` requests finished, their last work ``work``."""
        self.outstanding[replica] -= count
        self.add(replica, work, -1)

    def set_running(self, replica: int, running: int) -> None:
        """The replica's residents changed (prompts completed, requests finished or preempted)."""
        self.running[replica] = running

    def set_kv(self, replica: int, used: int) -> None:
        """The replica's KV blocks in use changed (admission, decode, finish, preemption)."""
        self.kv_used[replica] = used
        if self.kv_total is not None:
            self.kv_free[replica] = self.kv_total - used

    def set_replica(self, replica: int, outstanding: int, running: int, work: WorkSum | None) -> None:
        """All of one replica's counters at once (the compiled fleet, from what its kernel landed);
        ``work`` None: the work counters are not read in this run and stay as they were."""
        self.outstanding[replica] = outstanding
        self.running[replica] = running
        if work is not None:
            self._whole[replica], self._units[replica] = work.whole, work.units
            self._stale.add(replica)
            self.true_work[replica] = work.true

    # --- the fleet's balance ----------------------------------------------------------------------
    def balance_sample(self) -> float | None:
        """Outstanding true work, max / mean over the replicas (None while the mean is 0)."""
        work = self.true_work.astype(np.float64)
        mean = float(work.mean())
        return float(work.max()) / mean if mean > 0 else None


@dataclass
class FleetBalance:
    """Outstanding true work per replica, sampled after every routing: max / mean, averaged."""

    ratio_sum: float = 0.0
    samples: int = 0

    def add(self, accounting: ReplicaAccounting) -> None:
        ratio = accounting.balance_sample()
        if ratio is not None:
            self.ratio_sum += ratio
            self.samples += 1

    @property
    def max_over_mean(self) -> float | None:
        return self.ratio_sum / self.samples if self.samples else None
