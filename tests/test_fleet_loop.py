"""The compiled fleet loop (simulator/fleet_loop.py: every replica's kernel and the routing in one
numba function) replays the reference fleet byte for byte: random fleets with same-instant bursts,
on the unit engine with integer arrivals (steps end exactly at arrival instants) and on a fitted
profile with float gaps, every router with a compiled rule x the compiled policies on the default
rule x the predictors whose estimates need no Python or are compiled functions of precomputed rows
(none, oracle, noisy-oracle; leap, leap-rls on hand-made hidden states, their estimates on time or
late, leap-rls publishing every two finished requests). The routers' rules replay their Python twins
(power-of-two: numpy's generator word for word); a run the loop cannot take says why and keeps the
Python-driven walk."""

from __future__ import annotations

import functools
import importlib.util
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.trace import load_trace, trace_from_arrays
from policies import make_policy
from predictors import PredictorOptions, make_predictor
from routers import ROUTERS, make_router, rules
from routers.power_of_two import STREAM
from simulator.config import EngineConfig
from simulator.fleet import FleetSimulation
from simulator.profiles import make_profile
from simulator.profiles.unit import UnitProfile
from tests.test_compiled import assert_identical

#: routers the loop runs, policies compiled on the default rule, predictors that need no Python
COMPILED_ROUTERS = [name for name, cls in ROUTERS.items() if cls.compiled_rule is not None]
POLICIES = ["fcfs", "countdown", "aging", "ssjf-starvation"]
PREDICTORS = ["none", "oracle", "noisy-oracle", "leap", "leap-rls"]

needs_numba = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                 reason="numba is not installed (extra `fast`): the compiled kernel falls back")


def test_the_rules_are_declared_on_the_routers():
    assert set(COMPILED_ROUTERS) == {"round-robin", "least-requests", "least-work", "oracle-work", "power-of-two"}
    assert all(cls.compiled_rule in rules.RULES for cls in ROUTERS.values() if cls.compiled_rule is not None)


@settings(max_examples=40, deadline=None)
@given(replicas=st.integers(1, 4096), seed=st.integers(0, 2**32), routings=st.integers(1, 60),
       counts=st.lists(st.integers(0, 3), min_size=1, max_size=8))
def test_power_of_two_rule_draws_what_the_generator_draws(replicas, seed, routings, counts):
    """The rule's pairs are ``Generator.choice(N, 2, replace=False)``'s, call after call."""
    outstanding = np.resize(np.array(counts, dtype=np.int64), replicas)
    router = make_router("power-of-two")
    router.reset(replicas, seed)
    draws = router.compiled_draws(routings)
    rng = np.random.default_rng([seed, STREAM])
    state = np.zeros(rules.STATE_SIZE, dtype=np.int64)
    for _ in range(routings):
        if replicas == 1:
            expected = 0
        else:
            a, b = sorted(int(x) for x in rng.choice(replicas, size=2, replace=False))
            expected = b if outstanding[b] < outstanding[a] else a
        assert rules.power_of_two(state, outstanding, None, None, draws) == expected


def test_power_of_two_rule_says_when_its_draws_ran_out():
    draws = rules.words(np.random.default_rng(0), 2)
    state = np.zeros(rules.STATE_SIZE, dtype=np.int64)
    assert rules.power_of_two(state, np.zeros(5, dtype=np.int64), None, None, draws) == -1
    used = np.random.default_rng(0)
    used.integers(0, 10)   # a 32-bit word held back: the words would not be the generator's next ones
    with pytest.raises(ValueError, match="fresh PCG64"):
        rules.words(used, 4)


def _predictor(name: str, train=None):
    """A factory of predictor ``name``; LEAP's trained on ``train`` (a trace) when given, else lmsys."""
    if name == "none":
        return lambda: None
    options = PredictorOptions(noise_mae=40.0) if name == "noisy-oracle" else None
    if train is not None and name.startswith("leap"):
        options = PredictorOptions(train_trace=train, update_every=2, settings={name: {"cache": False}})
    return lambda: make_predictor(name, options)


#: hand-made hidden states: four dimensions, the first tracking the output length's square root
HIDDEN = 4


def _hidden(lengths: np.ndarray, seed: int) -> np.ndarray:
    noise = np.random.default_rng(seed).standard_normal((len(lengths), HIDDEN))
    noise[:, 0] += np.sqrt(lengths)
    return noise.astype(np.float32)


@functools.cache
def toy_training_trace():
    """The hand-made hidden states LEAP trains on in the unit fleets."""
    lengths = np.arange(64) % 9 + 1
    return trace_from_arrays("toy-train", np.full(64, 4), lengths, features={"feat_last": _hidden(lengths, 99)})


def _pair(workload, arrival, router, policy, predictor, replicas, seed, profile, config, train=None):
    from simulator.compiled_fleet import CompiledFleet

    fleets = [cls(workload, np.asarray(arrival, dtype=np.float64), replicas=replicas, router=make_router(router),
                  make_policy=lambda: make_policy(policy), make_predictor=_predictor(predictor, train), profile=profile,
                  config=config, seed=seed) for cls in (FleetSimulation, CompiledFleet)]
    return fleets, [fleet.run() for fleet in fleets]


def _assert_same(fleets, results):
    assert fleets[1].loop_fallback is None   # the loop really ran
    assert_identical(*results)
    assert results[0].replica.tolist() == results[1].replica.tolist()
    assert repr(results[0].balance_max_over_mean) == repr(results[1].balance_max_over_mean)


#: random unit-engine fleets: arrivals on a half-second grid with bursts, short outputs
UNIT_FLEETS = dict(
    n=st.integers(1, 40), replicas=st.integers(1, 5),
    gaps=st.lists(st.sampled_from([0, 0, 0.5, 1, 2]), min_size=40, max_size=40),
    lengths=st.lists(st.integers(1, 9), min_size=40, max_size=40), router=st.sampled_from(COMPILED_ROUTERS),
    policy=st.sampled_from(POLICIES), predictor=st.sampled_from(PREDICTORS), seed=st.integers(0, 5))


def unit_fleet(n, replicas, gaps, lengths, router, policy, predictor, seed):
    """One of UNIT_FLEETS on both fleets (a router reading predicted work gets the oracle, not none).
    LEAP's estimates are ready halfway through the prefill (the tapped layer: 1 of 4) on even seeds,
    on odd ones after the step's end (no layer: late, published by an event)."""
    if ROUTERS[router].reads == "predicted_work" and predictor == "none":
        predictor = "oracle"
    out = np.array(lengths[:n])
    tapped = {"layers": {"feat_last": 1}, "num_layers": 4} if seed % 2 == 0 else None
    trace = trace_from_arrays("toy", np.full(n, 4), out, features={"feat_last": _hidden(out, seed)}, metadata=tapped)
    config = EngineConfig(max_resident=3, decode_slots=2, prefill_token_budget=64, wait_cap=2)
    return _pair(trace, np.cumsum(gaps[:n]), router, policy, predictor, replicas, seed, UnitProfile(), config,
                 toy_training_trace())


@needs_numba
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**UNIT_FLEETS)
def test_loop_matches_reference_on_the_unit_engine(n, replicas, gaps, lengths, router, policy, predictor, seed):
    """Arrivals on a half-second grid with bursts on the unit engine (every step 1.0 s): steps end
    exactly at arrival instants, where a step's landing comes before the routing, also a step held
    over an earlier arrival (one at its middle)."""
    _assert_same(*unit_fleet(n, replicas, gaps, lengths, router, policy, predictor, seed))


@needs_numba
@pytest.mark.parametrize("predictor", ["leap", "leap-rls"])
@pytest.mark.parametrize("policy", ["fcfs", "countdown"])
@pytest.mark.parametrize("router", COMPILED_ROUTERS)
def test_loop_matches_reference_with_leap_on_every_router(router, policy, predictor):
    """Every router x {fcfs, countdown} x {leap, leap-rls}: bursts of three, a step held over an
    arrival, estimates on time (seed 0) and late (seed 1)."""
    gaps = [0, 0, 0, 0.5, 1, 0, 2, 0.5, 0, 0] * 4
    lengths = [3, 9, 1, 5, 7, 2, 8, 4, 6, 9] * 4
    for seed in (0, 1):
        fleets, results = unit_fleet(40, 3, gaps, lengths, router, policy, predictor, seed)
        _assert_same(fleets, results)
    held = "_Z" if predictor == "leap-rls" else "_pred"   # the rows the estimates are read from: once per fleet
    assert all(getattr(p, held) is getattr(fleets[1].predictors[0], held) for p in fleets[1].predictors)
    assert predictor == "leap" or results[1].updates_published > 5


@needs_numba
@pytest.mark.parametrize("update_s", [0.3, 0.7, 1.3])
@pytest.mark.parametrize("router", ["least-work", "least-requests"])
def test_loop_matches_reference_with_slow_online_updates(router, update_s):
    """LEAP+RLS updates that take the CPU worker most of a step, one or more steps: publishes fire
    while a replica's step is held over one or more arrival instants, before those are routed."""
    gaps = [0, 0, 0.25, 0.25, 0.25, 1, 0, 0.25, 0.5, 0.25] * 4   # up to three arrivals within a held step
    lengths = [3, 9, 1, 5, 7, 2, 8, 4, 6, 9] * 4
    with mock.patch("predictors.leap.online.rls_update_cpu_s", lambda requests, dim: update_s):
        fleets, results = unit_fleet(40, 3, gaps, lengths, router, "countdown", "leap-rls", 0)
    _assert_same(fleets, results)
    assert results[1].updates_published > 5


@needs_numba
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 60), replicas=st.integers(1, 6), gaps=st.lists(st.sampled_from([0.0, 0.01, 0.05, 0.3]),
                                                                       min_size=60, max_size=60),
       router=st.sampled_from(COMPILED_ROUTERS), policy=st.sampled_from(POLICIES),
       predictor=st.sampled_from(PREDICTORS), seed=st.integers(0, 5))
def test_loop_matches_reference_on_a_fitted_profile(n, replicas, gaps, router, policy, predictor, seed):
    """Float gaps with bursts (arrivals at one instant) on a fitted engine profile."""
    if ROUTERS[router].reads == "predicted_work" and predictor == "none":
        predictor = "oracle"
    trace = load_trace("lmsys")
    config = EngineConfig(max_resident=6, decode_slots=3, prefill_token_budget=2048, wait_cap=4)
    _assert_same(*_pair(trace.take(np.arange(n)), np.cumsum(gaps[:n]), router, policy, predictor, replicas, seed,
                        make_profile("qwen3-8b-h100", trace), config))


@needs_numba
@pytest.mark.parametrize(("router", "predictor", "why"), [
    ("least-requests", "trail", "needs Python between steps"),
    ("least-work", "ssjf", "needs Python between steps"),
    ("queue-depth", "none", "declares no compiled rule"),
])
def test_a_fleet_the_loop_cannot_take_keeps_the_python_walk(router, predictor, why):
    trace = load_trace("lmsys")
    fleets, results = _pair(trace.take(np.arange(30)), np.linspace(0.0, 3.0, 30), router, "countdown", predictor, 3,
                            0, make_profile("qwen3-8b-h100", trace), EngineConfig(max_resident=6, decode_slots=3))
    assert why in fleets[1].loop_fallback
    assert results[0].replica.tolist() == results[1].replica.tolist()
