"""Prefix caching in the compiled kernel (simulator/kernel_prefix.py; docs/semantics.md "Prefix
caching"): byte for byte the reference's outputs, each request's cached tokens and preemptions, on
hypothesis workloads whose requests share prefixes, with pools from the least the engine accepts
(blocks shared, evicted, re-hit after a preemption): single engines under every compiled policy on
the unit profile (same-instant events), and unit-engine fleets with same-instant arrivals under
the cache-reading routers (the Python walk over compiled replicas). The Mooncake done-when command
of issue 40 runs compiled with the reference's table. (The hand example: tests/test_kv_prefix.py.)
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

from core.io import CHECKOUT  # noqa: E402
from core.trace import trace_from_arrays  # noqa: E402
from experiments.cli import main  # noqa: E402
from policies import POLICIES, make_policy  # noqa: E402
from routers import ROUTERS, make_router  # noqa: E402
from simulator.compiled_fleet import CompiledFleet  # noqa: E402
from simulator.config import EngineConfig  # noqa: E402
from simulator.fleet import FleetSimulation  # noqa: E402
from simulator.kernel import DEFAULT_RULE  # noqa: E402
from simulator.profiles.unit import UnitProfile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from invariant_cases import HYPO, Case  # noqa: E402
from reference_prefix import with_prefix_hashes  # noqa: E402
from test_compiled import assert_identical  # noqa: E402
from test_compiled_kv import SLOS, assert_same, kv_cases, simulate  # noqa: E402
from test_kv_blocks import least_blocks  # noqa: E402
from test_kv_prefix import shared_prefixes  # noqa: E402

MOONCAKE = Path(os.environ.get("LEAP_DATA_DIR", CHECKOUT.parent / "shared" / "data")) / "arrivals" / \
    "mooncake_conversation_trace.jsonl"
#: the compiled policies on the default rule's kernel (each other rule's kernel is a compile of its own)
DEFAULT_RULE_POLICIES = tuple(name for name, cls in POLICIES.items() if cls.compiled and (
    make_policy(name, slos=SLOS).compiled_form().rule in (None, DEFAULT_RULE)))
#: the routers that read the replicas' caches or the prompts' block keys, and one that reads neither
CACHE_ROUTERS = sorted(name for name, cls in ROUTERS.items() if cls.reads in ("prefix", "cache")) + ["round-robin"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@st.composite
def prefix_kv_cases(draw):
    """:func:`test_compiled_kv.kv_cases` (the default rule's policies) with prefix caching on and
    shared prefixes."""
    case = draw(kv_cases(policies=DEFAULT_RULE_POLICIES))
    case.block_size = draw(st.sampled_from([1, 2, 4]))
    case.kv_blocks = least_blocks(case.prompt, case.output, case.block_size) + draw(st.integers(0, 8))
    case.prefix_caching, case.prefix = None, shared_prefixes(draw, case.prompt, case.block_size)
    return case


def assert_same_cache(ref, comp) -> None:
    assert_same(ref, comp)
    if not isinstance(ref, str):
        assert ref.cached_tokens.tobytes() == comp.cached_tokens.tobytes()


@settings(max_examples=60, **HYPO)
@given(prefix_kv_cases())
def test_compiled_matches_reference_with_shared_prefixes(case):
    assert_same_cache(simulate(case, "reference", "unit"), simulate(case, "compiled", "unit"))


def test_a_small_pool_hits_evicts_and_preempts():
    """Not vacuous: ten requests of one family through six blocks of 2 tokens hit the cache, and
    preempt; a preempted request's re-prefill finds its own blocks again (more cached after it)."""
    prompt, output = [6, 6, 5, 6, 4, 6, 6, 3, 6, 5], [4, 6, 3, 5, 7, 2, 6, 4, 3, 5]
    case = Case(prompt=prompt, output=output, arrival=[0, 0, 0, 1, 1, 2, 2, 3, 3, 3], policy="fcfs", predictor="none",
                fixed=None, noise_mae=0.0, seed=0, step_time="unit", max_resident=4, decode_slots=3, budget=8, wait_cap=0,
                kv_blocks=6, block_size=2, prefix=[[7, 8, 9][:p // 2] for p in prompt])
    ref, comp = simulate(case, "reference", "unit"), simulate(case, "compiled", "unit")
    assert_same_cache(ref, comp)
    assert comp.cached_tokens.sum() > 0 and comp.preemptions.sum() > 0


def _fleet(cls, n, replicas, gaps, lengths, prompts, prefix, router, seed, blocks):
    workload = with_prefix_hashes(trace_from_arrays("fleet", prompts[:n], lengths[:n]), prefix[:n], 2)
    config = EngineConfig(max_resident=3, decode_slots=2, prefill_token_budget=8, wait_cap=2, kv_blocks=blocks,
                          kv_block_size=2)
    return cls(workload, np.cumsum(gaps[:n]).astype(np.float64), replicas=replicas, router=make_router(router),
               make_policy=lambda: make_policy("fcfs"), make_predictor=lambda: None, profile=UnitProfile(),
               config=config, seed=seed)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(1, 24), replicas=st.integers(1, 4),
       gaps=st.lists(st.sampled_from([0, 0, 0.5, 1, 2]), min_size=24, max_size=24),
       lengths=st.lists(st.integers(1, 9), min_size=24, max_size=24),
       prompts=st.lists(st.integers(1, 9), min_size=24, max_size=24),
       router=st.sampled_from(CACHE_ROUTERS), seed=st.integers(0, 5), extra=st.integers(0, 4))
def test_compiled_fleet_matches_reference_with_shared_prefixes(data, n, replicas, gaps, lengths, prompts, router,
                                                               seed, extra):
    """Unit-engine fleets (every step 1.0 s) with arrivals on a half-second grid in bursts: steps
    land at routing instants, a held step's admissions are in the pool a router reads."""
    prefix = shared_prefixes(data.draw, prompts, 2)
    blocks = least_blocks(prompts[:n], lengths[:n], 2) + extra
    fleets = [_fleet(cls, n, replicas, gaps, lengths, prompts, prefix, router, seed, blocks)
              for cls in (FleetSimulation, CompiledFleet)]
    ref, comp = (fleet.run() for fleet in fleets)
    assert_identical(ref, comp)
    assert ref.replica.tolist() == comp.replica.tolist()
    assert ref.preemptions.tobytes() == comp.preemptions.tobytes()
    assert ref.cached_tokens.tobytes() == comp.cached_tokens.tobytes()


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="../shared/data/arrivals not present")
def test_the_mooncake_done_when_command_runs_compiled(tmp_path, capsys):
    """Issue 40's command (16 replicas, weighted, KV blocks from the profile, the cache on) with 60
    requests: compiled (no fallback note), the reference's table and per-request outputs. The
    compiled run first: it measures the fleet's capacity (cached for the reference's)."""
    tables, rows = {}, {}
    for kernel in ("compiled", "reference"):
        out = tmp_path / kernel
        assert main(["--arrivals", str(MOONCAKE), "--replicas", "16", "--router", "weighted", "--kv-blocks", "profile",
                     "--requests", "60", "--predictor", "none", "--kernel", kernel, "--jobs", "1",
                     "--out", str(out)]) == 0
        captured = capsys.readouterr()
        assert "uses the reference engine" not in captured.err
        tables[kernel] = captured.out.replace(str(out), "OUT")
        rows[kernel] = pq.read_table(out / "requests.parquet")
    assert tables["reference"] == tables["compiled"] and "hit rate" in tables["compiled"]
    assert rows["reference"].equals(rows["compiled"]) and sum(rows["compiled"]["cached_tokens"].to_pylist()) > 0
