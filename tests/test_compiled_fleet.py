"""A fleet on the compiled kernel replays the reference fleet byte for byte (docs/semantics.md
"Fleets"): every router, the policy/predictor pairs one compiled engine runs, on bundled traces and
on small random fleets; and a fleet the kernel cannot run still says so and falls back."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.trace import load_trace
from policies import make_policy
from predictors import make_predictor
from routers import ROUTERS, make_router
from simulator.compiled_fleet import CompiledFleet
from simulator.config import EngineConfig
from simulator.fleet import FleetSimulation
from simulator.profiles import make_profile
from simulator.runner import RunConfig, execute, prepare
from tests.test_compiled import assert_identical

# numba is imported only when a test runs the kernel, never at collection: a numba loaded in the
# pytest process breaks every later in-process vLLM engine (tests/conftest.py's run order)
if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

PAIRS = [("fcfs", "none"), ("countdown", "leap-rls"), ("countdown", "oracle"), ("aging", "oracle")]


def replay_kernels(config: RunConfig, compiled_class: type = CompiledFleet):
    """``config`` on both kernels (the compiled one really a ``compiled_class``); summaries less
    ``sim_cpu_s`` and results identical. Returns (reference, compiled) results."""
    runs = {}
    for kernel in ("reference", "compiled"):
        prepared = prepare(dataclasses.replace(config, kernel=kernel))
        assert isinstance(prepared.simulation, compiled_class) == (kernel == "compiled")
        summary, result = execute(prepared)
        summary.pop("sim_cpu_s")
        runs[kernel] = summary, result
    assert repr(runs["reference"][0]) == repr(runs["compiled"][0])
    assert_identical(runs["reference"][1], runs["compiled"][1])
    return runs["reference"][1], runs["compiled"][1]


def replay_fleet(config: RunConfig):
    """:func:`replay_kernels` of a fleet, its replicas too. Returns the compiled result."""
    reference, compiled = replay_kernels(config)
    assert (reference.replica == compiled.replica).all()
    return compiled


@pytest.mark.parametrize("router", list(ROUTERS))
@pytest.mark.parametrize(("policy", "predictor"), PAIRS)
def test_compiled_fleet_matches_reference(router, policy, predictor):
    if ROUTERS[router].reads == "predicted_work" and predictor == "none":
        pytest.skip("the router reads predicted work")
    if make_router(router).needs_kv:
        pytest.skip("the router reads KV blocks: tests/test_compiled_fleet_kv.py (test_fleet_cache_routers)")
    result = replay_fleet(RunConfig(trace="sharegpt", policy=policy, predictor=predictor, replicas=3,
                                    router=router, load=1.3, requests=240))
    assert len(set(result.replica.tolist())) == 3


@pytest.mark.parametrize("replicas", [2, 4])
def test_compiled_fleet_matches_reference_on_other_traces(replicas):
    replay_fleet(RunConfig(trace="alpaca", policy="countdown", predictor="leap-rls", replicas=replicas,
                           router="least-work", load=1.5, requests=200))
    replay_fleet(RunConfig(trace="math", policy="fcfs", replicas=replicas, router="power-of-two", load=2.0,
                           requests=200, seed=3))


def _fleet(cls, workload, arrival, router, policy, predictor, replicas, seed):
    trace = load_trace("lmsys")
    return cls(workload, arrival, replicas=replicas, router=make_router(router),
               make_policy=lambda: make_policy(policy),
               make_predictor=lambda: None if predictor == "none" else make_predictor(predictor),
               profile=make_profile("qwen3-8b-h100", trace),
               config=EngineConfig(max_resident=6, decode_slots=3, prefill_token_budget=2048, wait_cap=4), seed=seed)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), replicas=st.integers(1, 4), gaps=st.lists(st.sampled_from([0.0, 0.01, 0.05, 0.3]),
                                                                       min_size=40, max_size=40),
       router=st.sampled_from(list(ROUTERS)), pair=st.sampled_from(PAIRS), seed=st.integers(0, 5))
def test_compiled_fleet_matches_reference_on_random_fleets(n, replicas, gaps, router, pair, seed):
    """Small fleets with bursts (arrivals at one instant, steps ending at an arrival's instant)."""
    policy, predictor = pair
    if ROUTERS[router].reads == "predicted_work" and predictor == "none":
        predictor = "oracle"
    workload = load_trace("lmsys").take(np.arange(n))
    arrival = np.cumsum(gaps[:n])
    results = [_fleet(cls, workload, arrival, router, policy, predictor, replicas, seed).run()
               for cls in (FleetSimulation, CompiledFleet)]
    assert_identical(*results)
    assert (results[0].replica == results[1].replica).all()


def test_a_fleet_with_kv_blocks_and_the_cache_runs_compiled_unless_a_policy_reads_the_cache(capsys):
    """Prefix caching (on by default with KV blocks) is compiled: such a fleet runs on the compiled
    kernel without a note; a policy that reads the cached tokens (countdown's prefill weight) runs on
    the reference engine with the one-line note naming it (identity: tests/test_compiled_prefix.py)."""
    from simulator.compiled import note_fallback

    for options, cls in (((), CompiledFleet), ((("prefill_weight", 1.0),), FleetSimulation)):
        note_fallback.cache_clear()
        prepared = prepare(RunConfig(trace="sharegpt", replicas=2, router="least-requests", load=1.0, requests=60,
                                     policy="countdown", predictor="oracle", policy_options=options,
                                     engine_config=EngineConfig(kv_blocks=4096)))
        assert type(prepared.simulation) is cls
        err = capsys.readouterr().err
        assert err.count("reads the cached prompt tokens") == (cls is FleetSimulation), err
