"""The compiled kernel in a closed loop with predictors whose estimates land after prefill.

A closed loop submits the next request when one finishes, at the end of the step that finished it
(``RequestTable.retire``); a prefill-stage predictor's estimate is made in ``after_step``, before
that retire, or later as a SimPy event. The predictor sees the system as it was then (``Known``:
arrived, finished), so the rows a step's completions submit must not count as arrived for the
estimates that step's prefill (or an event during it) publishes. Hypothesis batches under vLLM V1
scheduling and a recorded trace, both kernels, byte for byte.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

from simulator.profiles import make_profile  # noqa: E402
from simulator.profiles.unit import UnitProfile  # noqa: E402
from simulator.runner import RunConfig  # noqa: E402
from simulator.workload import ArrivalSpec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compiled import OnlineLearning, PrefillStage, Refreshing, assert_identical, replay_both, simulate  # noqa: E402
from test_invariants import HYPO, vllm_cases  # noqa: E402


@st.composite
def closed_loop_cases(draw, **case_args):
    """vLLM V1 cases, always a closed loop (a batch, N in flight)."""
    case = draw(vllm_cases(**case_args))
    if case.closed_loop is None:
        case.closed_loop = draw(st.integers(min_value=1, max_value=len(case.prompt) + 2))
        case.arrival = [case.arrival[0]] * len(case.prompt)
    return case


def _profile(case):
    return UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")


POLICIES = ("fcfs", "countdown", "trail-preemption")


@settings(max_examples=300, **HYPO)
@given(closed_loop_cases(policies=POLICIES, predictors=("fixed",)))
def test_closed_loop_with_prefill_stage_predictors(case):
    """Estimates after prefill (at the step's end or later), read with the arrived count: each
    completion's submission lands after them."""
    cpu_s = [0.0, 0.3, 1.7, 0.004][case.seed % 4]
    tap = [1.0, 0.5, 0.8][case.seed % 3]
    ref = simulate(case, "reference", _profile(case), PrefillStage(case.fixed, cpu_s, tap))
    assert_identical(ref, simulate(case, "compiled", _profile(case), PrefillStage(case.fixed, cpu_s, tap)))


@settings(max_examples=300, **HYPO)
@given(closed_loop_cases(policies=POLICIES, predictors=("fixed",)), st.integers(1, 4),
       st.lists(st.sampled_from([0.0, 0.25, 1.0, 2.5, 7.0]), min_size=1, max_size=3).map(tuple))
def test_closed_loop_with_online_learning(case, batch, update_s):
    """Publishes that re-score the residents while a step runs, at its end, or after it lands."""
    cpu_s = [0.0, 0.3, 1.7, 0.004][case.seed % 4]
    tap = [1.0, 0.5, 0.8][case.seed % 3]
    ref = simulate(case, "reference", _profile(case), OnlineLearning(case.fixed, cpu_s, tap, batch, update_s))
    assert_identical(ref, simulate(case, "compiled", _profile(case),
                                   OnlineLearning(case.fixed, cpu_s, tap, batch, update_s)))


@settings(max_examples=200, **HYPO)
@given(closed_loop_cases(policies=POLICIES, predictors=("fixed",)), st.integers(1, 5))
def test_closed_loop_with_refreshing_prefill_stage_predictors(case, every):
    """LEAP with refresh's timing: an estimate after prefill, re-estimates every ``every`` tokens."""
    ref = simulate(case, "reference", _profile(case), Refreshing(case.fixed, "length", every, "prefill"))
    assert_identical(ref, simulate(case, "compiled", _profile(case),
                                   Refreshing(case.fixed, "length", every, "prefill")))


@pytest.mark.parametrize(("trace", "predictor", "refresh"), [("alpaca", "leap-rls", False), ("sharegpt", "leap", True),
                                                            ("sharegpt", "trail", True)])
def test_closed_loop_on_a_recorded_trace(trace, predictor, refresh):
    """The recorded preset's closed-loop batch replay (the recording's own window), countdown:
    LEAP+RLS (publishes), LEAP with refresh and TRAIL (sharegpt: decode states to refresh from)."""
    from predictors.base import PredictorOptions

    def closed(prepared):
        assert prepared.simulation.closed_loop is not None

    result = replay_both(RunConfig(trace=trace, predictor=predictor, policy="countdown", preset="recorded",
                                   arrivals=ArrivalSpec.parse("closed"), load=None,
                                   predictor_options=PredictorOptions(refresh=refresh)), closed)
    assert predictor != "leap-rls" or result.updates_published > 10
