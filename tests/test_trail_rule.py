"""TRAIL's rules are written once (:mod:`predictors.trail_rule`): compiled or plain Python they give
the same bits, and the compiled kernel driving TRAIL (:mod:`simulator.kernel_trail`) replays the
reference engine byte for byte."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the rules run as plain Python only", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compiled import assert_identical  # noqa: E402
from test_invariants import HYPO  # noqa: E402

from predictors import trail_rule  # noqa: E402
from predictors.trail import transition_matrix  # noqa: E402


def plain_rules():
    """A fresh, never-compiled copy of the rules module (plain Python)."""
    spec = importlib.util.spec_from_file_location("trail_rule_plain", trail_rule.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_state(rng, n: int, k: int, cap: int, vectors: int):
    post = rng.dirichlet(np.ones(k), size=n)
    rows = np.sort(rng.integers(0, n, size=vectors))
    gen = np.zeros(vectors, dtype=np.int64)
    for r in np.unique(rows):   # each row's vectors at increasing multiples of 4, below the cap
        at = rows == r
        gen[at] = 4 * np.arange(1, at.sum() + 1)
    keep = gen < cap
    rows, gen = rows[keep], gen[keep]
    lik = rng.dirichlet(np.ones(k), size=len(rows) + n)
    return trail_rule.TrailArrays(
        post=post, g_post=np.zeros(n, dtype=np.int64), prefilled=np.zeros(n, dtype=np.bool_),
        used_g=np.zeros(n, dtype=np.int64), total=np.zeros(n), prefill_lik=np.ascontiguousarray(lik[:n]),
        dec_key=(rows.astype(np.int64) << 32) | gen, dec_gen=gen, dec_lik=np.ascontiguousarray(lik[n:]),
        vec_start=np.searchsorted(rows, np.arange(n), side="left").astype(np.int64),
        powers=trail_rule.power_table(transition_matrix(k, cap / k), cap), mid=(np.arange(k) + 0.5) * cap / k,
        cap=float(cap), scratch=np.zeros(2 * k))


def copy_state(a):
    return a._replace(**{f: getattr(a, f).copy() for f in a._fields if isinstance(getattr(a, f), np.ndarray)})


@settings(max_examples=60, **HYPO)
@given(st.integers(0, 2**31), st.integers(1, 12), st.integers(2, 12), st.integers(8, 80))
def test_compiled_rules_give_the_plain_python_bits(seed, n, k, cap):
    """The same observations, refreshes and estimates through numba and through plain Python."""
    rng = np.random.default_rng(seed)
    plain = plain_rules()
    assert trail_rule.load() and hasattr(trail_rule.refresh_rows, "py_func")
    state = random_state(rng, n, k, cap, vectors=3 * n)
    states = {"compiled": state, "plain": copy_state(state)}
    rules = {"compiled": trail_rule, "plain": plain}
    ops = []
    for _ in range(6):
        rows = rng.choice(n, size=rng.integers(1, n + 1), replace=False).astype(np.int64)
        generated = rng.integers(1, cap + 1, size=len(rows)).astype(np.int64)
        ops.append((int(rng.integers(3)), rows, generated))
    for name, a in states.items():
        for op, rows, generated in ops:
            if op == 0:
                rules[name].after_prefill_rows(rows, a)
            elif op == 1:
                rules[name].refresh_rows(rows, np.maximum(generated, a.g_post[rows]), a)
            else:
                rules[name].estimate_rows(rows, np.maximum(generated, a.g_post[rows]), a)
    for field in ("post", "g_post", "prefilled", "used_g", "total"):
        assert getattr(states["compiled"], field).tobytes() == getattr(states["plain"], field).tobytes(), field


@pytest.fixture(scope="module")
def lmsys():
    from core.trace import load_trace
    return load_trace("lmsys")


@settings(max_examples=25, **HYPO)
@given(st.integers(8, 120), st.floats(0.0, 0.2), st.sampled_from(["countdown", "trail-preemption", "fcfs"]),
       st.integers(1, 12), st.integers(0, 24), st.booleans(), st.booleans(), st.integers(0, 2**31))
def test_trail_in_the_kernel_matches_the_reference(lmsys, n, gap, policy, slots, wait_cap, chunked, charge, seed):
    """TRAIL (bundled weights, decode-vector refreshes) on recorded rows, random arrivals and engine
    settings: both kernels give the same bytes, and the compiled one asks Python for nothing."""
    from policies import make_policy
    from predictors import make_predictor
    from simulator.compiled import unsupported
    from simulator.engine import EngineConfig, Simulation
    from simulator.profiles import make_profile
    from simulator.runner import run_simulation

    rng = np.random.default_rng(seed)
    workload = lmsys.take(np.sort(rng.choice(len(lmsys), size=n, replace=False)))
    arrival = np.cumsum(rng.exponential(gap, size=n)) if gap else np.zeros(n)
    config = EngineConfig(max_resident=max(slots, 2 * slots), decode_slots=slots, wait_cap=wait_cap,
                          chunked_prefill=chunked)
    results, calls = {}, {}
    for kernel in ("reference", "compiled"):
        predictor = make_predictor("trail")
        sim = Simulation(workload, arrival, policy=make_policy(policy), predictor=predictor,
                         profile=make_profile("qwen3-8b-h100", lmsys), config=config, seed=1,
                         charge_cost=charge)
        assert kernel == "reference" or unsupported(sim) is None
        calls[kernel] = count_calls(predictor)
        results[kernel] = run_simulation(sim, kernel)
        assert predictor.refresh_every == 64
    assert_identical(results["reference"], results["compiled"])
    assert calls["compiled"] == [0] and calls["reference"][0] > 0


def count_calls(predictor) -> list[int]:
    """Count the bound predictor's Python calls (predict, after_prefill, refresh)."""
    count = [0]
    for name in ("predict", "after_prefill", "refresh"):
        fn = getattr(predictor, name)

        def counted(*a, fn=fn, **k):
            count[0] += 1
            return fn(*a, **k)
        setattr(predictor, name, counted)
    return count
