"""A fleet with KV blocks (no prefix caching) on the compiled kernel replays the reference fleet
byte for byte: each replica's preemptions, the router's KV counters (blocks used and free, read
from the replicas' kernels) and the residents a held step preempted (docs/semantics.md "Fleets",
"KV blocks"); with prefix caching on it falls back with one note."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.trace import load_trace, trace_from_arrays
from policies import make_policy
from predictors import make_predictor
from routers import ROUTERS, make_router
from simulator.compiled_fleet import CompiledFleet
from simulator.config import EngineConfig
from simulator.fleet import FleetSimulation
from simulator.profiles import make_profile
from simulator.runner import RunConfig, prepare
from tests.test_compiled import assert_identical
from tests.test_compiled_fleet import replay_fleet

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

#: routers a fleet with KV blocks and no prefix caching runs (the cache-reading ones need the cache)
KV_ROUTERS = [name for name in ROUTERS if not make_router(name).needs_cache]
PAIRS = [("fcfs", "none"), ("countdown", "oracle"), ("trail-preemption", "oracle")]


@pytest.mark.parametrize("router", KV_ROUTERS)
def test_compiled_fleet_with_kv_blocks_matches_reference(router):
    predictor = "oracle" if ROUTERS[router].reads == "predicted_work" else "none"
    policy = "countdown" if predictor == "oracle" else "fcfs"
    result = replay_fleet(RunConfig(trace="sharegpt", policy=policy, predictor=predictor, replicas=3, router=router,
                                    load=1.5, requests=240,
                                    engine_config=EngineConfig(kv_blocks=600, prefix_caching=False)))
    assert result.preemptions.sum() > 0


def _fleet(cls, workload, arrival, router, policy, predictor, replicas, seed, blocks, size):
    return cls(workload, arrival, replicas=replicas, router=make_router(router),
               make_policy=lambda: make_policy(policy),
               make_predictor=lambda: None if predictor == "none" else make_predictor(predictor),
               profile=make_profile("unit"),
               config=EngineConfig(max_resident=6, decode_slots=3, prefill_token_budget=64, wait_cap=4,
                                   kv_blocks=blocks, kv_block_size=size, prefix_caching=False), seed=seed)


@settings(max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 30), replicas=st.integers(1, 4), gaps=st.lists(st.sampled_from([0, 0, 1, 2, 5]), min_size=30,
                                                                       max_size=30),
       router=st.sampled_from(KV_ROUTERS), pair=st.sampled_from(PAIRS), seed=st.integers(0, 5),
       size=st.sampled_from([2, 4, 16]), extra=st.integers(0, 4))
def test_compiled_fleet_with_kv_blocks_on_random_fleets(n, replicas, gaps, router, pair, seed, size, extra):
    """Small unit-engine fleets with integer arrivals in bursts (steps end at arrival instants: held
    steps that preempted while a request is routed) and caches small enough to preempt."""
    policy, predictor = pair
    if ROUTERS[router].reads == "predicted_work" and predictor == "none":
        predictor = "oracle"
    trace = load_trace("lmsys").take(np.arange(n))
    prompt, output = np.minimum(trace.prompt_tokens, 40), np.minimum(trace.output_tokens, 30)
    workload = trace_from_arrays("fleet", prompt.tolist(), output.tolist())
    blocks = int(max(-(-(p + o - 1) // size) for p, o in zip(prompt, output))) + extra
    arrival = np.cumsum(gaps[:n]).astype(np.float64)
    results = [_fleet(cls, workload, arrival, router, policy, predictor, replicas, seed, blocks, size).run()
               for cls in (FleetSimulation, CompiledFleet)]
    assert_identical(*results)
    assert (results[0].replica == results[1].replica).all()
    assert results[0].preemptions.tobytes() == results[1].preemptions.tobytes()


def test_a_fleet_without_prefix_caching_runs_compiled(capsys):
    from simulator.compiled import note_fallback
    note_fallback.cache_clear()
    prepared = prepare(RunConfig(trace="sharegpt", replicas=2, router="least-requests", load=1.0, requests=60,
                                 engine_config=EngineConfig(kv_blocks=4096, prefix_caching=False)))
    assert type(prepared.simulation) is CompiledFleet
    assert "uses the reference engine" not in capsys.readouterr().err
