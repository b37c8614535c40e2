"""The simulator's invariants (docs/semantics.md, "Invariants"), one test each, plus exact
agreement between the engine and an independent brute-force reference (tests/reference_sim.py).

Invariants, numbered as in docs/semantics.md:
  1. conservation          arrived = finished + waiting + resident at every step; all finish
  2. limits                resident <= max_resident and decoded <= decode_slots in every step
  3. causality             arrival <= admit <= first token <= finish
  4. monotone clock        steps start in order and never overlap
  5. work conservation     no idle time while work exists; full decode batches; greedy admission
  6. oracle boundary       policies and predictors never see the true length
  7. constant aging = FCFS pure aging with a constant score reproduces FCFS exactly
  8. same seed             same seed -> identical per-request output

Each invariant is checked on hypothesis-generated small workloads (derandomized) and on runs of
400 real ShareGPT requests at Poisson load below and above capacity (roofline profile). Here:
invariants 1-5; agreement with the reference: tests/test_invariant_agreement.py; invariants 6-8:
tests/test_invariant_boundary.py; the shared parts: tests/invariant_cases.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given

sys.path.insert(0, str(Path(__file__).resolve().parent))
import invariant_cases  # noqa: E402
from invariant_cases import (  # noqa: E402, F401
    AGREEMENT_SETTINGS,
    ALL_CHECKS,
    GAPS,
    HYPO,
    INVARIANT_SETTINGS,
    PREDICTION,
    REAL_LOADS,
    REAL_N,
    REAL_POLICIES,
    REL,
    STEP_TIMES,
    Case,
    ConstantPredictor,
    FixedPredictor,
    FunctionProfile,
    RecordingPolicy,
    RecordingProfile,
    _arrays,
    _check_real,
    _finished_before,
    affine_step_time,
    assert_agrees,
    caller_index,
    cases,
    check_causality,
    check_conservation,
    check_limits,
    check_monotone_clock,
    check_oracle_boundary,
    check_work_conservation,
    close,
    engine_predictions,
    make_predictor_for,
    run_case_recorded,
    run_engine,
    run_recorded,
    run_reference,
    to_caller_order,
    vllm_cases,
)

# the real-trace fixtures, module-scoped as they were
sharegpt = invariant_cases.sharegpt
roofline = invariant_cases.roofline
capacity = invariant_cases.capacity
real_runs = invariant_cases.real_runs


# ============================================================================= 1. conservation
@INVARIANT_SETTINGS
@given(cases())
def test_invariant_conservation(case):
    """Invariant 1 (conservation): at every step, arrived = finished + waiting + resident, and every
    request finishes by the end of the run."""
    check_conservation(run_engine(case), case.config)


def test_invariant_conservation_sharegpt(real_runs):
    """Invariant 1 (conservation) on real ShareGPT runs below and above capacity."""
    _check_real(real_runs, check_conservation)


# ============================================================================= 2. limits
@INVARIANT_SETTINGS
@given(cases())
def test_invariant_limits(case):
    """Invariant 2 (limits): resident <= max_resident and decoded <= decode_slots in every step."""
    check_limits(run_engine(case), case.config)


def test_invariant_limits_sharegpt(real_runs):
    """Invariant 2 (limits) on real ShareGPT runs below and above capacity."""
    _check_real(real_runs, check_limits)


# ============================================================================= 3. causality
@INVARIANT_SETTINGS
@given(cases())
def test_invariant_causality(case):
    """Invariant 3 (causality): arrival <= admit <= first token <= finish for every request."""
    check_causality(run_engine(case), case.config)


def test_invariant_causality_sharegpt(real_runs):
    """Invariant 3 (causality) on real ShareGPT runs below and above capacity."""
    _check_real(real_runs, check_causality)


# ============================================================================= 4. monotone clock
@INVARIANT_SETTINGS
@given(cases())
def test_invariant_monotone_clock(case):
    """Invariant 4 (monotone clock): step start times strictly increase, every step has a positive
    duration, and a step never starts before the previous one ends."""
    check_monotone_clock(run_engine(case), case.config)


def test_invariant_monotone_clock_sharegpt(real_runs):
    """Invariant 4 (monotone clock) on real ShareGPT runs below and above capacity."""
    _check_real(real_runs, check_monotone_clock)


# ============================================================================= 5. work conservation
@INVARIANT_SETTINGS
@given(cases())
def test_invariant_work_conservation(case):
    """Invariant 5 (work conservation): the engine never idles while a request is waiting or resident
    (an idle gap ends exactly at the next arrival); each step decodes min(decode_slots, ready
    residents) and admits whenever there is room and a request waiting."""
    check_work_conservation(run_engine(case), case.config)


def test_invariant_work_conservation_sharegpt(real_runs):
    """Invariant 5 (work conservation) on real ShareGPT runs below and above capacity."""
    _check_real(real_runs, check_work_conservation)
