"""Invariants 6-8 of docs/semantics.md: the oracle boundary (policies and predictors never see the
true length), constant aging = FCFS, same seed -> same output; and the closed loop's refusal of
staggered arrivals (shared parts: tests/invariant_cases.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.trace import trace_from_arrays
from policies import make_policy
from predictors.noisy_oracle import NoisyOracle
from simulator.engine import RunResult, Simulation
from simulator.profiles import make_profile
from simulator.workload import ArrivalSpec, make_arrivals

sys.path.insert(0, str(Path(__file__).resolve().parent))
import invariant_cases  # noqa: E402
from invariant_cases import (  # noqa: E402, F401
    INVARIANT_SETTINGS,
    REAL_LOADS,
    REAL_N,
    REAL_POLICIES,
    STEP_TIMES,
    Case,
    ConstantPredictor,
    FixedPredictor,
    FunctionProfile,
    _arrays,
    cases,
    check_oracle_boundary,
    close,
    run_case_recorded,
    run_engine,
    run_recorded,
)

# the real-trace fixtures, module-scoped as they were
sharegpt = invariant_cases.sharegpt
roofline = invariant_cases.roofline
capacity = invariant_cases.capacity
real_runs = invariant_cases.real_runs


# ============================================================================= 6. oracle boundary
@st.composite
def boundary_cases(draw):
    case = draw(cases(predictors=("fixed",)))
    n = len(case.output)
    changed = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=max(1, n // 3), unique=True))
    extra = draw(st.lists(st.integers(1, 40), min_size=len(changed), max_size=len(changed)))
    longer = list(case.output)
    for i, e in zip(changed, extra):
        longer[i] += e
    return case, longer


@INVARIANT_SETTINGS
@given(boundary_cases())
def test_invariant_oracle_boundary(case_and_longer):
    """Invariant 6 (oracle boundary): policies and predictors never see the true length; the engine
    reads it only to decide completion. Two runs with the same predictions whose true lengths
    differ (some requests are longer) produce the same schedule - same steps, admissions, decode
    counts, first tokens and finishes - until the first completion that differs."""
    case, longer = case_and_longer
    check_oracle_boundary(lambda out: run_case_recorded(case, out), case.output, longer)


def test_invariant_oracle_boundary_detects_leaks():
    """The oracle-boundary check can fail: with the oracle the predictions follow the true length,
    so changing a length changes the schedule at once and the check must reject it."""
    case = Case(prompt=[1, 1, 1], output=[1000, 50, 100], arrival=[0.0, 0.0, 0.0], policy="countdown",
                predictor="oracle", fixed=None, noise_mae=0.0, seed=0, step_time="unit", max_resident=512,
                decode_slots=1, budget=8192, wait_cap=0)
    with pytest.raises(AssertionError):
        check_oracle_boundary(lambda out: run_case_recorded(case, out), [1000, 50, 100], [1000, 200, 100])
    # the same change under fixed predictions is fine
    fixed = Case(**{**case.__dict__, "predictor": "fixed", "fixed": [1000.0, 50.0, 100.0]})
    check_oracle_boundary(lambda out: run_case_recorded(fixed, out), [1000, 50, 100], [1000, 200, 100])


@pytest.mark.parametrize("policy", REAL_POLICIES)
def test_invariant_oracle_boundary_sharegpt(policy, sharegpt, roofline, capacity):
    """Invariant 6 (oracle boundary) on real ShareGPT requests at 2x capacity: noisy fixed predictions,
    20 requests made longer."""
    rng = np.random.default_rng(11)
    truth = sharegpt.output_tokens.astype(np.int64)
    predictions = np.maximum(truth + rng.normal(0, 50, size=REAL_N), 1.0)
    longer = truth.copy()
    longer[rng.choice(REAL_N, size=20, replace=False)] += rng.integers(1, 200, size=20)
    arrival = make_arrivals(ArrivalSpec("poisson"), sharegpt, 2.0 * capacity, seed=5)

    def run(output):
        wl = trace_from_arrays("sharegpt-subset", sharegpt.prompt_tokens, output)
        return run_recorded(wl, arrival, policy, FixedPredictor(predictions), roofline)

    check_oracle_boundary(run, truth, longer)


# ============================================================================= 7. constant aging = FCFS
def _assert_same_run(a: RunResult, b: RunResult) -> None:
    assert np.array_equal(a.rows_request_id, b.rows_request_id)
    for name in ("admit_s", "first_token_s", "finish_s", "forced_steps"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.steps == b.steps
    la, lb = _arrays(a), _arrays(b)
    for name in la:
        assert np.array_equal(la[name], lb[name]), name


@INVARIANT_SETTINGS
@given(cases(policies=("fcfs",), predictors=("none",)), st.sampled_from(["rank", "length"]),
       st.floats(min_value=0.01, max_value=1000.0, allow_nan=False))
def test_invariant_constant_aging_is_fcfs(case, kind, value):
    """Invariant 7 (pure aging with a constant score reproduces FCFS exactly): aging over a constant
    score (a constant rank score; or a constant predicted length <= 1.5, whose countdown key is at
    the 0.5 floor for every resident request) gives the identical run to FCFS."""
    if kind == "length":
        value = min(value, 1.5)
    fcfs = run_engine(case)
    aging = Simulation(trace_from_arrays("hypo", case.prompt, case.output), np.asarray(case.arrival),
                       policy=make_policy("aging"), predictor=ConstantPredictor(value, kind),
                       profile=FunctionProfile(STEP_TIMES[case.step_time]), config=case.config, seed=case.seed,
                       record_steps=True).run()
    _assert_same_run(fcfs, aging)


@pytest.mark.parametrize("load", REAL_LOADS)
def test_invariant_constant_aging_is_fcfs_sharegpt(load, real_runs, sharegpt, roofline, capacity):
    """Invariant 7 on real ShareGPT runs: aging with a constant rank score == the FCFS run."""
    arrival = make_arrivals(ArrivalSpec("poisson"), sharegpt, load * capacity, seed=7)
    aging = Simulation(sharegpt, arrival, policy=make_policy("aging"), predictor=ConstantPredictor(3.0, "rank"),
                       profile=roofline, record_steps=True).run()
    _assert_same_run(real_runs[("fcfs", load)], aging)


# ============================================================================= 8. same seed
@INVARIANT_SETTINGS
@given(cases(predictors=("noisy",)))
def test_invariant_same_seed_same_output(case):
    """Invariant 8 (same seed -> identical per-request output): two runs of the same workload with the
    same seed are identical request for request and step for step (seeded noisy predictions
    included); a different seed draws different predictions."""
    a, b = run_engine(case), run_engine(case)
    _assert_same_run(a, b)
    assert np.array_equal(a.predicted_tokens, b.predicted_tokens)
    other = run_engine(Case(**{**case.__dict__, "seed": case.seed + 1}))
    if (a.predicted_tokens > 1).any() or (other.predicted_tokens > 1).any():   # not all floored at 1 token
        assert not np.array_equal(a.predicted_tokens, other.predicted_tokens)


@pytest.mark.parametrize("policy", REAL_POLICIES)
def test_invariant_same_seed_same_output_sharegpt(policy, sharegpt, roofline, capacity):
    """Invariant 8 on ShareGPT at 2x capacity: the same seed gives the same Poisson arrivals and an
    identical run; a different seed gives different arrivals."""
    rate = 2.0 * capacity
    arr1 = make_arrivals(ArrivalSpec("poisson"), sharegpt, rate, seed=123)
    arr2 = make_arrivals(ArrivalSpec("poisson"), sharegpt, rate, seed=123)
    assert np.array_equal(arr1, arr2)
    assert not np.array_equal(arr1, make_arrivals(ArrivalSpec("poisson"), sharegpt, rate, seed=124))

    def run(arrival, seed):
        predictor = None if policy == "fcfs" else NoisyOracle(50.0)
        return Simulation(sharegpt, arrival, policy=make_policy(policy), predictor=predictor, profile=roofline,
                          seed=seed, record_steps=True).run()

    a, b = run(arr1, 9), run(arr2, 9)
    _assert_same_run(a, b)
    assert np.array_equal(a.predicted_tokens, b.predicted_tokens, equal_nan=True)


def test_closed_loop_refuses_staggered_arrivals():
    """Closed loop replays a batch; with staggered submission times the release order is undefined."""
    wl = trace_from_arrays("hypo", [3, 4, 5], [2, 2, 2])
    with pytest.raises(ValueError, match="same time"):
        Simulation(wl, np.array([0.0, 1.0, 2.0]), policy=make_policy("fcfs"), predictor=None,
                   profile=make_profile("unit"), closed_loop=2)
    Simulation(wl, np.full(3, 2.0), policy=make_policy("fcfs"), predictor=None, profile=make_profile("unit"),
               closed_loop=2).run()
