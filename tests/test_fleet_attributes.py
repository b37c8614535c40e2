"""Request attributes travel with a routed request (docs/semantics.md "Fleets"): the toy "priority
class, then least predicted work" policy of docs/extending.md, 40 requests with a ``priority``
column, gives the single engine's result in a one-replica fleet and the same bytes on both kernels
at 2 and 4 replicas, each replica serving its urgent class first."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pyarrow as pa
import pytest

from core.trace import trace_from_arrays
from predictors import make_predictor
from routers import make_router
from simulator.engine import EngineConfig, Simulation
from simulator.fleet import FleetSimulation
from simulator.profiles.unit import UnitProfile
from tests.test_extending import toy_site  # noqa: F401  (the fixture: the toy policy's files)

N = 40
CONFIG = EngineConfig(max_resident=N, decode_slots=4, wait_cap=0)


def _trace(with_priority: bool = True):
    rng = np.random.default_rng(3)
    trace = trace_from_arrays("toy", np.full(N, 8), rng.integers(2, 30, N))
    priority = np.where(np.arange(N) % 2 == 0, 1, 0)   # odd rows are the urgent class (0)
    if with_priority:
        trace = dataclasses.replace(trace, table=trace.table.append_column("priority", pa.array(priority, pa.int64())))
    return trace, priority


@pytest.fixture
def toy(monkeypatch, toy_site):  # noqa: F811
    monkeypatch.syspath_prepend(str(toy_site))
    from toy_policy import ToyPriority

    return ToyPriority


def _fleet(cls, policy, trace, arrival, replicas: int, router: str):
    return cls(trace, arrival, replicas=replicas, router=make_router(router), make_policy=policy,
               make_predictor=lambda: make_predictor("oracle"), profile=UnitProfile(), config=CONFIG,
               charge_cost=False).run()


def _classes(finish: np.ndarray, priority: np.ndarray) -> tuple[float, float]:
    return float(finish[priority == 0].mean()), float(finish[priority == 1].mean())


def test_one_replica_fleet_gives_the_single_engines_per_class_result(toy):
    trace, priority = _trace()
    arrival = np.zeros(N)
    single = Simulation(trace, arrival, policy=toy(), predictor=make_predictor("oracle"), profile=UnitProfile(),
                        config=CONFIG, charge_cost=False).run()
    fleet = _fleet(FleetSimulation, toy, trace, arrival, 1, "round-robin")
    assert fleet.finish_s.tobytes() == single.finish_s.tobytes()
    urgent, other = _classes(single.finish_s, priority)
    assert urgent < other   # the class is served first
    plain = _fleet(FleetSimulation, toy, _trace(with_priority=False)[0], arrival, 1, "round-robin")
    assert _classes(plain.finish_s, priority) != (urgent, other)   # the column is what made the difference


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba is not installed")
@pytest.mark.parametrize("replicas", [1, 2, 4])
@pytest.mark.parametrize("router", ["round-robin", "least-work"])
def test_both_kernels_route_and_serve_by_class_alike(toy, replicas, router):
    """Staggered integer arrivals (steps end at arrival instants); each replica serves its urgent
    requests first, on both kernels byte for byte."""
    from simulator.compiled_fleet import CompiledFleet, fleet_unsupported

    trace, priority = _trace()
    arrival = np.sort(np.random.default_rng(5).integers(0, 12, N)).astype(np.float64)
    assert fleet_unsupported(CONFIG, toy(), make_predictor("oracle"), UnitProfile()) is None
    ref, comp = (_fleet(cls, toy, trace, arrival, replicas, router) for cls in (FleetSimulation, CompiledFleet))
    assert ref.finish_s.tobytes() == comp.finish_s.tobytes()
    assert ref.replica is not None and comp.replica is not None and (ref.replica == comp.replica).all()
    for r in range(replicas):
        mine = ref.replica == r
        if (priority[mine] == 0).any() and (priority[mine] == 1).any():
            wait = ref.finish_s[mine] - arrival[mine]
            assert wait[priority[mine] == 0].mean() < wait[priority[mine] == 1].mean()


# --- leap-serve replays carry the trace's attributes to vLLM ------------------------------------------
def test_a_traces_priority_becomes_the_vllm_request_field():
    from core.attributes import live_fields

    trace, priority = _trace()
    assert live_fields(trace, [0, 1, 5]) == [{"priority": 1}, {"priority": 0}, {"priority": 0}]
    assert live_fields(_trace(with_priority=False)[0], [0, 1]) == [{}, {}]   # no column: nothing new is sent


def test_in_process_replay_submits_the_priority():
    """leap-serve in process: ``VLLMBackend._submit`` (every step-clocked and seconds-clocked
    submission) and the capacity measurement hand the request's fields to ``add_request``."""
    from types import SimpleNamespace

    from capture.backend import GenRequest
    from capture.backend_vllm import VLLMBackend

    calls = []

    class Engine:
        def add_request(self, rid, prompt, params, **fields):
            calls.append((rid, fields))
            return rid

    fake = SimpleNamespace(engine=Engine())
    VLLMBackend._submit(fake, GenRequest("a", [1, 2], {"priority": 3}), None, {}, {})   # type: ignore[arg-type]
    VLLMBackend._submit(fake, GenRequest("b", [1, 2]), None, {}, {})                    # type: ignore[arg-type]
    assert calls == [("a", {"priority": 3}), ("b", {})]


def test_server_replay_sends_the_priority():
    """leap-serve --server: the chat completion's JSON body carries ``priority`` (vLLM's field)."""
    from live.http_client import chat_body

    sampling = {"temperature": 0.0, "top_p": 1.0, "repetition_penalty": 1.0}
    body = chat_body("m", "hi", sampling, 5, True, None, {"priority": 1})
    assert body["priority"] == 1 and body["max_tokens"] == 5
    assert "priority" not in chat_body("m", "hi", sampling, 5, True, None)
