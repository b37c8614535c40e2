"""Exact agreement between the engine and an independent brute-force reference
(tests/reference_sim.py): generated workloads, vLLM-style scheduling, a KV budget, real ShareGPT
runs, the worked example and aging's exact keys (shared parts: tests/invariant_cases.py).
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
from predictors.oracle import Oracle
from simulator.engine import EngineConfig, Simulation
from simulator.workload import ArrivalSpec, make_arrivals

sys.path.insert(0, str(Path(__file__).resolve().parent))
import invariant_cases  # noqa: E402
import reference_sim  # noqa: E402
from invariant_cases import (  # noqa: E402, F401
    AGREEMENT_SETTINGS,
    ALL_CHECKS,
    INVARIANT_SETTINGS,
    REAL_POLICIES,
    STEP_TIMES,
    Case,
    FunctionProfile,
    RecordingProfile,
    _arrays,
    assert_agrees,
    cases,
    check_causality,
    check_conservation,
    check_limits,
    check_monotone_clock,
    close,
    engine_predictions,
    make_predictor_for,
    run_engine,
    run_reference,
    to_caller_order,
    vllm_cases,
)

# the real-trace fixtures, module-scoped as they were
sharegpt = invariant_cases.sharegpt
roofline = invariant_cases.roofline
capacity = invariant_cases.capacity


# ============================================================================= agreement with the reference
@AGREEMENT_SETTINGS
@given(cases())
def test_engine_agrees_with_reference(case):
    """The engine and the brute-force reference agree exactly: row order, per-request admit / first
    token / finish times (1e-9 relative), forced steps, and every step's composition; the engine's
    run also satisfies every step-log invariant."""
    result = run_engine(case)
    ref = run_reference(case, engine_predictions(case, result))
    assert_agrees(result, ref)
    for check in ALL_CHECKS:
        check(result, case.config)


@AGREEMENT_SETTINGS
@given(vllm_cases())
def test_engine_agrees_with_reference_vllm_scheduling(case):
    """Exact agreement under chunked prefill, decodes in the token budget and closed loop (each on
    or off): per-request times, forced steps and every step's composition; the step-log checks that
    do not assume whole-prompt admission (conservation, limits, causality, monotone clock) hold."""
    result = run_engine(case)
    ref = run_reference(case, engine_predictions(case, result))
    assert_agrees(result, ref)
    for check in (check_conservation, check_limits, check_causality, check_monotone_clock):
        check(result, case.config)


@st.composite
def kv_cases(draw):
    """``cases`` or ``vllm_cases`` with a KV budget between the least the engine accepts (every
    prompt + its first token, one token per resident request) and a little more than that."""
    case = draw(st.one_of(cases(), vllm_cases()))
    least = max(max(case.prompt) + 1, case.max_resident)
    case.kv_budget = least + draw(st.integers(min_value=0, max_value=60))
    return case


@AGREEMENT_SETTINGS
@given(kv_cases())
def test_engine_agrees_with_reference_under_a_kv_budget(case):
    """Exact agreement when admission is also limited by the KV budget (prompt tokens computed plus
    tokens generated, held until the request finishes)."""
    result = run_engine(case)
    ref = run_reference(case, engine_predictions(case, result))
    assert_agrees(result, ref)
    for check in (check_conservation, check_causality, check_monotone_clock):
        check(result, case.config)


@INVARIANT_SETTINGS
@given(vllm_cases())
def test_invariant_closed_loop_window_and_chunk_budget(case):
    """Closed loop: never more than N submitted-and-unfinished requests, and each submission after
    the first N is some request's completion. Chunked prefill with decodes in budget: a step's work
    never exceeds the token budget unless decodes alone do (or an unchunked prompt goes alone)."""
    result = run_engine(case)
    arrival, finish = result.arrival_s, result.finish_s
    if case.closed_loop is not None:
        n = case.closed_loop
        for t in np.unique(arrival):
            assert int(((arrival <= t) & (finish > t)).sum()) <= n
        assert np.array_equal(np.sort(arrival[n:]), np.sort(finish)[:max(len(arrival) - n, 0)])
    if case.chunked_prefill and case.decodes_in_budget:
        profile = RecordingProfile(FunctionProfile(STEP_TIMES[case.step_time]))
        wl = trace_from_arrays("hypo", case.prompt, case.output)
        Simulation(wl, np.asarray(case.arrival, dtype=np.float64), policy=make_policy(case.policy),
                   predictor=make_predictor_for(case), profile=profile, config=case.config, seed=case.seed,
                   closed_loop=case.closed_loop).run()
        for prefill_tokens, _, decode_batch, _ in profile.calls:
            assert prefill_tokens + decode_batch <= max(case.budget, decode_batch)


@pytest.mark.parametrize("policy", REAL_POLICIES)
def test_engine_agrees_with_reference_sharegpt(policy, sharegpt, roofline, capacity):
    """Exact agreement on 150 real requests at 2x capacity with the roofline profile and tight limits
    (so that admission, the prefill budget and the wait cap all bind)."""
    wl = sharegpt.take(np.arange(150))
    arrival = make_arrivals(ArrivalSpec("poisson"), wl, 2.0 * capacity, seed=3)
    config = EngineConfig(max_resident=24, decode_slots=8, prefill_token_budget=512, wait_cap=5)
    predictor = None if policy == "fcfs" else Oracle()
    result = Simulation(wl, arrival, policy=make_policy(policy), predictor=predictor, profile=roofline,
                        config=config, record_steps=True).run()
    ids = [str(r) for r in wl.request_id]
    ref = reference_sim.simulate(wl.prompt_tokens.tolist(), wl.output_tokens.tolist(), arrival.tolist(),
                                 policy=policy, predicted=wl.output_tokens.tolist(), step_time=roofline.step_time,
                                 max_resident=24, decode_slots=8, prefill_token_budget=512, wait_cap=5,
                                 request_ids=ids)
    # map ids to the caller's index for the comparison helpers
    pos = {rid: i for i, rid in enumerate(ids)}
    assert [pos[str(r)] for r in result.rows_request_id] == ref["row_order"]
    for name in ("admit_s", "first_token_s", "finish_s"):
        engine = getattr(result, name)
        for row, rid in enumerate(result.rows_request_id):
            assert close(engine[row], ref[name][pos[str(rid)]]), (name, rid)
    assert [int(result.forced_steps[row]) for row in np.argsort([pos[str(r)] for r in result.rows_request_id])] \
        == ref["forced_steps"]
    assert sum(ref["forced_steps"]) > 0 and max(s["admitted"] for s in ref["steps"]) > 1
    assert result.steps == len(ref["steps"])


@pytest.mark.parametrize("policy,expected", [("countdown", [1148, 50, 149]), ("fcfs", [1000, 1049, 1148])])
def test_worked_example(policy, expected):
    """Three requests at t=0 of lengths 1000, 50, 100, one decode slot, unit steps, no wait cap."""
    case = Case(prompt=[1, 1, 1], output=[1000, 50, 100], arrival=[0.0, 0.0, 0.0], policy=policy,
                predictor="oracle" if policy != "fcfs" else "none", fixed=None, noise_mae=0.0, seed=0,
                step_time="unit", max_resident=512, decode_slots=1, budget=8192, wait_cap=0)
    result = run_engine(case)
    assert to_caller_order(result, result.finish_s.tolist()) == expected
    ref = run_reference(case, [1000.0, 50.0, 100.0] if policy != "fcfs" else None)
    assert ref["finish_s"] == expected
    assert_agrees(result, ref)


def _aging_case(output, arrival, fixed, max_resident):
    return Case(prompt=[1] * len(output), output=output, arrival=arrival, policy="aging", predictor="fixed",
                fixed=fixed, noise_mae=0.0, seed=0, step_time="unit", max_resident=max_resident, decode_slots=1,
                budget=8192, wait_cap=0)


def test_aging_clock_is_floored_to_5s_and_wait_clamped_at_0():
    """Aging ages every request to the same instant, the last multiple of 5 s, and a request that
    arrived after that instant has wait 0 (not a negative wait). Hand-checked decisions that the
    random workloads rarely pin down (scores must be within 2% of each other):

    admission (max_resident 1): r0 (pred 1) runs t=0..7; at t=7 the aging clock is 5: r1 (arrived
    0, pred 100) has key 100 * 0.9 ** (5/30) = 98.26, r2 (arrived 6, pred 98) has key 98, so r2 is
    admitted first. (Aging to t=7 itself would give 97.57 vs 97.66, r1 first; an unclamped wait of
    -1 would give r2 98.34, r1 first.)
    decode (one slot): at t=7 r0 has 100 predicted tokens left (107 - 7), r1 (arrived 6) 98 (99 - 1):
    r1 takes the slot."""
    case = _aging_case([7, 1, 1], [0.0, 0.0, 6.0], [1.0, 100.0, 98.0], max_resident=1)
    result, ref = run_engine(case), run_reference(case, case.fixed)
    assert ref["admit_s"] == [0.0, 8.0, 7.0]
    assert_agrees(result, ref)

    case = _aging_case([200, 200], [0.0, 6.0], [107.0, 99.0], max_resident=8)
    result, ref = run_engine(case), run_reference(case, case.fixed)
    at7 = [s for s in ref["steps"] if s["start_s"] == 7.0][0]
    assert at7["decoded_ids"] == [1]
    assert_agrees(result, ref)


def test_aging_exact_tie_broken_by_row():
    """Regression (found by this suite): aging keys that are mathematically equal must tie and fall
    back to row order (arrival, id). Computed naively as score * exp(ln(0.9)/30 * wait) in float64,
    equal keys differ in the last bit and the later arrival could win; the policy now compares
    rounded log-keys.

    Repro: max_resident 1, one decode slot, unit steps, no wait cap, fixed predictions. r0 (arrival
    0, pred 1, 41 tokens) holds the engine until t=41; at t=41 (aging clock 40) the waiting r1
    (arrival 0, pred 30) and r2 (arrival 30, pred 27) have equal keys,
    30 * 0.9 ** (40/30) == 27 * 0.9 ** (10/30) = 26.0682..., so r1 (earlier row) must be admitted
    at 41 and r2 at 46. The engine computes 26.068213384352006 vs 26.068213384352003 and admits r2
    first."""
    case = _aging_case([41, 5, 5], [0.0, 0.0, 30.0], [1.0, 30.0, 27.0], max_resident=1)
    ref = run_reference(case, case.fixed)
    assert ref["admit_s"] == [0.0, 41.0, 46.0]
    result = run_engine(case)
    assert to_caller_order(result, result.admit_s.tolist()) == [0.0, 41.0, 46.0], \
        "engine broke an exact aging-key tie against row order"
