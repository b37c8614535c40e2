"""Fleets (docs/semantics.md "Fleets"): N replicas behind a router under one clock.

Checks: one replica is the single engine byte for byte, whatever the router; every request is
routed exactly once; each replica is a whole engine (its requests replayed alone give the same
times); round-robin's assignment is exact; least-requests agrees with an independent brute-force
router rebuilt from the run's own outcomes (hypothesis); the run is reproducible by seed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.trace import load_trace, trace_from_arrays
from policies import make_policy
from predictors import make_predictor
from routers import ROUTERS, make_router
from simulator.engine import EngineConfig, Simulation
from simulator.fleet import FleetSimulation
from simulator.metrics import requests_table
from simulator.profiles import make_profile
from simulator.workload import ArrivalSpec, make_arrivals

SMALL = EngineConfig(max_resident=16, decode_slots=4, prefill_token_budget=2048)


def _sharegpt(n: int = 240, rate: float = 40.0, seed: int = 0):
    trace = load_trace("sharegpt")
    workload = trace.take(np.arange(n))
    arrival = make_arrivals(ArrivalSpec(), workload, rate, seed)
    return workload, arrival, make_profile("qwen3-8b-h100", trace)


def _single(workload, arrival, profile, policy, predictor, config=SMALL, seed=0):
    pred = make_predictor(predictor) if predictor != "none" else None
    return Simulation(workload, arrival, policy=make_policy(policy), predictor=pred, profile=profile,
                      config=config, seed=seed).run()


def _fleet(workload, arrival, profile, policy, predictor, replicas, router, config=SMALL, seed=0):
    return FleetSimulation(
        workload, arrival, replicas=replicas, router=make_router(router), make_policy=lambda: make_policy(policy),
        make_predictor=lambda: make_predictor(predictor) if predictor != "none" else None,
        profile=profile, config=config, seed=seed).run()


def _bytes(result) -> dict:
    table = requests_table(result)
    return {name: table.column(name).to_pylist() for name in table.column_names if name != "replica"}


@pytest.mark.parametrize("router", list(ROUTERS))
@pytest.mark.parametrize(("policy", "predictor"), [("fcfs", "none"), ("countdown", "oracle"),
                                                   ("countdown", "leap-rls")])
def test_one_replica_is_the_single_engine_byte_for_byte(router, policy, predictor):
    if ROUTERS[router].reads == "predicted_work" and predictor == "none":
        pytest.skip("least-work needs a predictor (refused before any run: test_fleet_cli)")
    workload, arrival, profile = _sharegpt()
    single = _single(workload, arrival, profile, policy, predictor)
    fleet = _fleet(workload, arrival, profile, policy, predictor, 1, router)
    assert _bytes(fleet) == _bytes(single)
    assert (fleet.steps, fleet.updates_published, fleet.contended_steps) == \
           (single.steps, single.updates_published, single.contended_steps)
    assert fleet.replica is not None and (fleet.replica == 0).all()


@pytest.mark.parametrize("router", list(ROUTERS))
def test_every_request_is_routed_once_and_each_replica_is_a_whole_engine(router):
    """Each replica's requests, replayed alone on one engine at the same arrival times, finish at
    the same instants: a replica is a whole engine, and the fleet only decides who goes where."""
    workload, arrival, profile = _sharegpt(rate=120.0)
    fleet = _fleet(workload, arrival, profile, "countdown", "oracle", 4, router)
    assert fleet.replica is not None
    assert fleet.replica.shape == (len(workload),) and set(np.unique(fleet.replica)) <= {0, 1, 2, 3}
    assert np.bincount(fleet.replica, minlength=4).sum() == len(workload)
    assert np.isfinite(fleet.finish_s).all() and (fleet.admit_s >= fleet.arrival_s).all()
    for r in range(4):
        mine = np.flatnonzero(fleet.replica == r)
        if not len(mine):
            continue
        alone = _single(fleet.workload.take(mine), fleet.arrival_s[mine], profile, "countdown", "oracle")
        np.testing.assert_array_equal(alone.finish_s, fleet.finish_s[mine])
        np.testing.assert_array_equal(alone.first_token_s, fleet.first_token_s[mine])


def test_round_robin_assignment_is_exact():
    workload, arrival, profile = _sharegpt(n=101)
    fleet = _fleet(workload, arrival, profile, "fcfs", "none", 3, "round-robin")
    np.testing.assert_array_equal(fleet.replica, np.arange(101) % 3)


def brute_force_least_requests(arrival, finish, replicas: int) -> list[int]:
    """Independent rule: at each arrival (row order), the requests routed earlier to each replica
    and not finished by that instant (a finish at the same instant has landed), fewest first, lowest
    index on ties. It replays the routing from the run's own finish times."""
    chosen: list[int] = []
    for g in range(len(arrival)):
        counts = [sum(1 for h in range(g) if chosen[h] == r and finish[h] > arrival[g]) for r in range(replicas)]
        chosen.append(min(range(replicas), key=lambda r: (counts[r], r)))
    return chosen


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.lists(st.tuples(st.integers(0, 6), st.integers(1, 40), st.integers(1, 12)),
                                   min_size=1, max_size=24))
def test_least_requests_matches_a_brute_force_router(replicas, rows):
    gaps, prompts, outputs = (np.array(x) for x in zip(*rows))
    arrival = np.cumsum(gaps).astype(np.float64)   # integer times on the unit engine: many exact ties
    workload = trace_from_arrays("toy", prompts, outputs)
    config = EngineConfig(max_resident=3, decode_slots=2, prefill_token_budget=64)
    fleet = _fleet(workload, arrival, make_profile("unit", workload), "fcfs", "none", replicas, "least-requests",
                   config=config)
    assert fleet.replica is not None
    assert fleet.replica.tolist() == brute_force_least_requests(fleet.arrival_s, fleet.finish_s, replicas)


def test_power_of_two_follows_the_seed():
    workload, arrival, profile = _sharegpt(n=120)
    a = _fleet(workload, arrival, profile, "fcfs", "none", 4, "power-of-two", seed=3)
    b = _fleet(workload, arrival, profile, "fcfs", "none", 4, "power-of-two", seed=3)
    c = _fleet(workload, arrival, profile, "fcfs", "none", 4, "power-of-two", seed=4)
    assert a.replica is not None and b.replica is not None and c.replica is not None
    np.testing.assert_array_equal(a.replica, b.replica)
    assert not np.array_equal(a.replica, c.replica)


def test_least_work_refuses_a_predictor_that_cannot_serve_it():
    workload, arrival, profile = _sharegpt(n=20)
    with pytest.raises(ValueError, match="--router least-work reads predicted work: --predictor ltr cannot serve it"):
        _fleet(workload, arrival, profile, "countdown", "ltr", 2, "least-work")


@pytest.mark.parametrize(("predictor", "kind"), [("oracle", "prompt"), ("leap-rls", "prior")])
def test_least_work_reads_the_declared_routing_estimate(predictor, kind):
    """Until a replica's own estimate exists, least-work counts the routing estimate the predictor
    declares: the prompt-only prediction (the oracle's is the true length) or the prior (LEAP)."""
    workload, arrival, profile = _sharegpt(n=120, rate=120.0)
    sim = FleetSimulation(workload, arrival, replicas=3, router=make_router("least-work"),
                          make_policy=lambda: make_policy("countdown"), make_predictor=lambda: make_predictor(predictor),
                          profile=profile, config=SMALL)
    sim.run()
    assert sim.predictors[0].router_estimate() == kind
    expected = (sim.length.astype(np.float64) if kind == "prompt"
                else np.full(sim.n, sim.predictors[0].prior_length))
    np.testing.assert_array_equal(sim.route_estimate, expected)
    assert len({id(p) for p in sim.predictors}) == (1 if sim.predictors[0].static_estimates else 3)


def test_every_predictor_declares_a_routing_estimate_it_can_make():
    """A prompt-only estimate needs an arrival-stage predictor; a rank score is no token count."""
    from predictors import PREDICTORS

    for name, cls in PREDICTORS.items():
        assert cls.router_estimate() in ("prompt", "prior", None), name
        if cls.router_estimate() == "prompt":
            assert cls.stage == "arrival", name
        if cls.output == "rank":
            assert cls.router_estimate() is None, name
