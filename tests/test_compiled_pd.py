"""A P/D fleet on the compiled kernel replays the reference PDFleet byte for byte (docs/semantics.md
"Prefill/decode disaggregation", "Kernel"): random fleets on the unit engine, where prefill ends,
landings, decode steps and arrivals fall on one grid (same-instant events in SimPy's order); the
done-when command's table on both kernels; and the P/D runs the kernel cannot replay say why."""

from __future__ import annotations

import functools
import importlib.util

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.trace import load_trace, trace_from_arrays
from experiments.cli import main
from policies import make_policy
from predictors import make_predictor
from routers import make_router
from simulator.config import EngineConfig
from simulator.pd_fleet import PDFleet
from simulator.pd_link import KVLink
from simulator.profiles import make_profile
from simulator.profiles.unit import UnitProfile
from simulator.runner import RunConfig
from tests.test_compiled import assert_identical
from tests.test_compiled_fleet import replay_kernels
from tests.test_fleet_cli import EXAMPLE

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

# 10 prompt tokens' KV cross this link in 0.5 s (tests/test_pd_fleet.py's hand link): on the grid
GRID_GBPS = 0.02359296
DECODE_ROUTERS = ("least-kv", "least-predicted-kv", "least-work", "oracle-kv", "oracle-work", "least-requests",
                  "power-of-two", "round-robin")
STAGES = ("prefill_replica", "decode_replica", "prefill_done_s", "transfer_start_s", "transfer_end_s",
          "decode_placed_s")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _both(workload, arrival, *, prefill, decode, decode_router, policy, predictor, link, config, router="round-robin",
          profile=None):
    """The reference and the compiled P/D fleet of these settings, run: (reference, compiled) results."""
    from simulator.compiled_pd import CompiledPDFleet

    results = []
    for cls in (PDFleet, CompiledPDFleet):
        fleet = cls(workload, np.asarray(arrival, dtype=np.float64), prefill_replicas=prefill,
                    decode_replicas=decode, router=make_router(router), decode_router=make_router(decode_router),
                    link=link, make_policy=lambda: make_policy(policy),
                    make_predictor=lambda: None if predictor == "none" else make_predictor(predictor),
                    profile=profile or UnitProfile(), config=config, charge_cost=False)
        results.append(fleet.run())
    return results


def assert_same_pd(ref, comp) -> None:
    """Every output column, each stage and the decode balance, byte for byte."""
    assert_identical(ref, comp)
    for name in STAGES:
        assert ref.stages[name].tobytes() == comp.stages[name].tobytes(), name
    assert repr(ref.balance_max_over_mean) == repr(comp.balance_max_over_mean)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 30), prefill=st.integers(1, 3), decode=st.integers(1, 3),
       gaps=st.lists(st.sampled_from([0, 0, 0.5, 1, 2]), min_size=30, max_size=30),
       lengths=st.lists(st.integers(1, 9), min_size=30, max_size=30),
       prompts=st.lists(st.sampled_from([10, 20, 30]), min_size=30, max_size=30),
       latency_ms=st.sampled_from([0.0, 500.0, 1000.0]), decode_router=st.sampled_from(DECODE_ROUTERS),
       policy=st.sampled_from(["fcfs", "countdown"]), predictor=st.sampled_from(["none", "oracle"]))
def test_compiled_pd_matches_reference_on_the_unit_engine(n, prefill, decode, gaps, lengths, prompts, latency_ms,
                                                          decode_router, policy, predictor):
    """Bursts and gaps on a half-second grid, transfers of 0.5-1.5 s plus 0, 0.5 or 1 s latency, each
    unit step 1 s: prefill ends, landings, decode steps and arrivals coincide, where the reference's
    order (steps land, arrivals, placements in row order, transfers start, landings) decides."""
    if predictor == "none" and (decode_router in ("least-predicted-kv", "least-work") or policy == "countdown"):
        predictor = "oracle"   # they read estimates
    workload = trace_from_arrays("toy", np.array(prompts[:n]), np.array(lengths[:n]))
    config = EngineConfig(max_resident=3, decode_slots=2, prefill_token_budget=24, wait_cap=2)
    ref, comp = _both(workload, np.cumsum(gaps[:n]), prefill=prefill, decode=decode, decode_router=decode_router,
                      policy=policy, predictor=predictor, link=KVLink(GRID_GBPS, latency_ms), config=config)
    assert_same_pd(ref, comp)


@functools.cache
def _lmsys():
    """The lmsys trace and the default engine's profile fitted beside it (read once)."""
    trace = load_trace("lmsys")
    return trace, make_profile("qwen3-8b-h100", trace)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 50), prefill=st.integers(1, 3), decode=st.integers(1, 3),
       gaps=st.lists(st.sampled_from([0.0, 0.01, 0.05, 0.3]), min_size=50, max_size=50),
       link=st.sampled_from([KVLink(), KVLink(50.0, 5.0), KVLink(1.0, 0.0)]),
       router=st.sampled_from(["round-robin", "least-requests", "least-work"]),
       decode_router=st.sampled_from(DECODE_ROUTERS), policy=st.sampled_from(["fcfs", "countdown"]),
       predictor=st.sampled_from(["none", "oracle", "noisy-oracle"]))
def test_compiled_pd_matches_reference_on_a_fitted_profile(n, prefill, decode, gaps, link, router, decode_router,
                                                           policy, predictor):
    """Float instants with bursts on a fitted engine profile; slow and fast links."""
    if predictor == "none" and ("work" in router or decode_router in ("least-predicted-kv", "least-work")
                                or policy == "countdown"):
        predictor = "oracle"
    trace, profile = _lmsys()
    config = EngineConfig(max_resident=6, decode_slots=3, prefill_token_budget=2048, wait_cap=4)
    assert_same_pd(*_both(trace.take(np.arange(n)), np.cumsum(gaps[:n]), prefill=prefill, decode=decode,
                          decode_router=decode_router, policy=policy, predictor=predictor, link=link, config=config,
                          router=router, profile=profile))


def test_compiled_pd_matches_reference_on_a_bundled_trace():
    """The default (roofline) engine on sharegpt: float instants, chunked prefill, the default link."""
    from simulator.compiled_pd import CompiledPDFleet

    assert_same_pd(*replay_kernels(RunConfig(trace="sharegpt", policy="countdown", predictor="oracle", prefill_replicas=2,
                                             decode_replicas=3, decode_router="least-predicted-kv", load=1.5,
                                             requests=150), CompiledPDFleet))


DONE_WHEN = ["--trace", "sharegpt", "--requests", "60", "--prefill-replicas", "2", "--decode-replicas", "3",
             "--decode-router", "least-predicted-kv", "--predictor", "oracle", "--slo", "ttft:2000", "tpot:100",
             "--find-max-rate", "--quiet", "--jobs", "1"]


def test_done_when_command_runs_compiled_with_the_reference_table(capsys):
    """The P/D done-when command (oracle estimates, a 60-request slice) on ``--kernel compiled``: no
    fallback note, the table ``--kernel reference`` prints."""
    assert main([*DONE_WHEN, "--kernel", "reference"]) == 0
    reference = capsys.readouterr()
    assert main([*DONE_WHEN, "--kernel", "compiled"]) == 0
    compiled = capsys.readouterr()
    assert "--kernel compiled" not in compiled.err
    assert compiled.out == reference.out and "P/D" in compiled.out


@pytest.mark.parametrize(("flags", "why"), [
    (["--trace", str(EXAMPLE), "--engine", "unit", "--arrivals", "recorded", "--kv-blocks", "400"],
     "--kv-blocks at its decode instances"),
    (["--trace", "sharegpt", "--requests", "20", "--load", "1", "--predictor", "leap-rls"],
     "predictor 'leap-rls' estimates in Python"),
])
def test_pd_runs_the_kernel_cannot_replay_say_why(flags, why, capsys):
    """Reserved decode blocks and estimates made in Python fall back to the reference, with one note."""
    from simulator.compiled import note_fallback

    note_fallback.cache_clear()
    args = ["--prefill-replicas", "1", "--decode-replicas", "2", "--quiet", "--jobs", "1", "--kernel", "compiled", *flags]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert err.count("--kernel compiled: a P/D fleet:") == 1 and why in err
