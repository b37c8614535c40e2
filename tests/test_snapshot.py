"""The replicas' accounting a router reads (routers/snapshot.py, docs/semantics.md "Fleets").

Checks: the work sums are exact (any order of updates gives the same numbers, equal work ties
exactly); a hand example with generated tokens; the reference fleet's counters, kept current at
each event, equal a recount from the replicas' tables at every routing; the compiled fleet's
counters (recounted from what its kernels landed) are the reference's at every routing; the
balance is read from the counters."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.trace import load_trace, trace_from_arrays
from policies import make_policy
from predictors import make_predictor
from routers import make_router
from routers.base import FleetView, Router
from routers.snapshot import ReplicaAccounting, WorkSum, work_sum
from simulator.config import EngineConfig
from simulator.fleet import FleetSimulation
from simulator.profiles import make_profile
from simulator.workload import ArrivalSpec, make_arrivals


def test_hand_example_with_generated_tokens():
    """Estimates 10.5, 3, 2.25 with 4, 3, 0 tokens generated: max(6.5, 1) + max(0, 1) + 2.25 = 9.75;
    true lengths 12, 5, 2: 8 + 2 + 2 = 12."""
    got = work_sum(np.array([10.5, 3.0, 2.25]), np.array([4, 3, 0]), np.array([12, 5, 2]))
    acc = ReplicaAccounting(2)
    acc.route(1, got)
    assert acc.predicted_work.tolist() == [0.0, 9.75] and acc.true_work.tolist() == [0, 12]
    assert acc.outstanding.tolist() == [0, 1] and acc.waiting.tolist() == [0, 1]
    acc.set_running(1, 1)
    assert acc.waiting.tolist() == [0, 0]
    acc.finish(1, 1, got)
    assert acc.predicted_work.tolist() == [0.0, 0.0] and acc.true_work.tolist() == [0, 0]
    assert acc.kv_free.tolist() == [-1, -1]
    view = acc.view("outstanding")
    assert view.outstanding is not None and view.work is None and view.kv_used is None
    acc.set_kv(0, 3)
    kv = ReplicaAccounting(2, kv_blocks_per_replica=10)
    kv.set_kv(1, 4)
    view = kv.view("kv")
    assert view.kv_used.tolist() == [0, 4] and view.kv_free.tolist() == [10, 6] and view.outstanding is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 5e4), st.integers(0, 400)), min_size=1, max_size=60), st.randoms())
def test_work_is_exact_whatever_the_order_of_updates(rows, rnd):
    """Adding requests one by one, in any order, and removing any of them gives exactly the sum
    over what remains (a float running sum would drift)."""
    est = np.array([e for e, _ in rows])
    gen = np.array([g for _, g in rows], dtype=np.int64)
    acc = ReplicaAccounting(1)
    order = list(range(len(rows)))
    rnd.shuffle(order)
    for i in order:
        acc.route(0, work_sum(est[i:i + 1], gen[i:i + 1], None))
    gone = order[: len(order) // 2]
    for i in gone:
        acc.finish(0, 1, work_sum(est[i:i + 1], gen[i:i + 1], None))
    kept = np.array(sorted(set(range(len(rows))) - set(gone)), dtype=np.int64)
    assert acc.predicted_work[0] == ReplicaAccounting._exact(work_sum(est[kept], gen[kept], None))
    exact = sum((max(e - g, 1.0) for e, g in zip(est[kept], gen[kept])), 0.0) if len(kept) else 0.0
    assert abs(acc.predicted_work[0] - exact) <= 1e-9 * max(exact, 1.0)
    assert acc.outstanding[0] == len(kept)


class Recorder(Router):
    """Routes as ``inner`` does and records the whole accounting at every routing."""

    name = "recorder"

    def __init__(self, inner: Router):
        self.inner, self.reads, self.seen = inner, inner.reads, []   # type: ignore[misc]

    def reset(self, replicas: int, seed: int) -> None:
        super().reset(replicas, seed)
        self.inner.reset(replicas, seed)

    def choose(self, row: int, view: FleetView) -> int:
        acc = self.fleet.accounting
        fields = [acc.outstanding.tolist(), acc.running.tolist(), acc.true_work.tolist(), acc.kv_used.tolist()]
        if self.reads == "predicted_work":
            fields.append(acc.predicted_work.tolist())
        self.seen.append(fields)
        if isinstance(self.fleet, FleetSimulation) and type(self.fleet) is FleetSimulation:
            self._recount(acc)
        return self.inner.choose(row, view)

    def _recount(self, acc: ReplicaAccounting) -> None:
        """The reference fleet's counters, kept at each event, are a recount of its tables."""
        for replica in self.fleet.fleet:
            t = replica.parts.table
            assert acc.outstanding[replica.index] == replica.routed - t.finished
            assert acc.running[replica.index] == len(t.resident)
            recount = self.fleet.replica_work(replica)
            assert acc.true_work[replica.index] == recount.true
            if self.reads == "predicted_work":   # kept only where a router reads it
                assert acc.predicted_work[replica.index] == ReplicaAccounting._exact(recount)


def _run(cls, router: str, policy: str, predictor: str, replicas: int = 3, config=None, n: int = 160):
    trace = load_trace("sharegpt")
    workload = trace.take(np.arange(n))
    arrival = make_arrivals(ArrivalSpec(), workload, 80.0, 0)
    rec = Recorder(make_router(router))
    sim = cls(workload, arrival, replicas=replicas, router=rec, make_policy=lambda: make_policy(policy),
              make_predictor=lambda: make_predictor(predictor) if predictor != "none" else None,
              profile=make_profile("qwen3-8b-h100", trace),
              config=config or EngineConfig(max_resident=8, decode_slots=4, prefill_token_budget=2048), seed=1)
    rec.fleet = sim
    return sim, sim.run(), rec.seen


@pytest.mark.parametrize(("router", "policy", "predictor"), [
    ("least-work", "countdown", "leap-rls"), ("least-work", "ssjf-starvation", "ssjf"),
    ("oracle-work", "fcfs", "none"), ("least-requests", "countdown", "leap")])
def test_reference_counters_are_a_recount_at_every_routing(router, policy, predictor):
    _, result, seen = _run(FleetSimulation, router, policy, predictor)
    assert len(seen) == len(result.replica)


def test_kv_counters_follow_the_blocks():
    config = EngineConfig(max_resident=8, decode_slots=4, prefill_token_budget=2048, kv_blocks=420, kv_block_size=16)
    sim, result, seen = _run(FleetSimulation, "least-requests", "fcfs", "none", config=config)
    assert result.preemptions is not None and result.preemptions.sum() > 0   # preemptions happened
    used = np.array([s[3] for s in seen])
    assert used.max() > 0 and (used <= 420).all()
    assert (sim.accounting.kv_used + sim.accounting.kv_free == 420).all()


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba is not installed")
@pytest.mark.parametrize(("router", "policy", "predictor"), [
    ("least-work", "countdown", "leap-rls"), ("oracle-work", "countdown", "oracle"), ("least-requests", "fcfs", "none")])
def test_compiled_fleet_counters_are_the_reference_ones(router, policy, predictor):
    from simulator.compiled_fleet import CompiledFleet

    runs = [_run(cls, router, policy, predictor) for cls in (FleetSimulation, CompiledFleet)]
    assert runs[0][2] == runs[1][2]
    assert runs[0][1].balance_max_over_mean == runs[1][1].balance_max_over_mean


def test_balance_is_read_from_the_counters():
    """Two replicas, true work 6 and 2 after the routing: max / mean = 6 / 4."""
    workload = trace_from_arrays("toy", np.array([3, 3]), np.array([6, 2]))
    sim = FleetSimulation(workload, np.zeros(2), replicas=2, router=make_router("round-robin"),
                          make_policy=lambda: make_policy("fcfs"), make_predictor=lambda: None,
                          profile=make_profile("unit", workload),
                          config=EngineConfig(max_resident=4, decode_slots=4, prefill_token_budget=64))
    result = sim.run()
    # first routing: [6, 0] -> 2.0; second: [6, 2] -> 1.5
    assert result.balance_max_over_mean == (2.0 + 1.5) / 2
    assert WorkSum() == work_sum(np.empty(0), np.empty(0, dtype=np.int64), None)
