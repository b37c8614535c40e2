"""Prefill estimates fixed at bind time are published inside compiled code
(:mod:`simulator.kernel_estimates`), byte-identical to the reference engine's Python publish."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compiled import PrefillStage, assert_identical, replay_both, simulate  # noqa: E402
from test_invariants import HYPO, cases  # noqa: E402

from predictors.base import Known, PredictorOptions  # noqa: E402
from simulator.profiles import make_profile  # noqa: E402
from simulator.profiles.unit import UnitProfile  # noqa: E402
from simulator.runner import RunConfig  # noqa: E402


class FixedPrefill(PrefillStage):
    """A prefill-stage predictor whose estimates are fixed per row (a frozen read-out); counts the
    Python ``predict`` calls, which the compiled kernel makes only for estimates late past a step."""

    name = "prefill-fixed-rows"

    def __init__(self, values, cpu_s: float, tap: float):
        super().__init__(values, cpu_s, tap)
        self.calls = 0

    def predict(self, rows, known: Known | None = None):
        self.calls += 1
        return self._rows[rows]

    def fixed_estimates(self):
        return self._rows


@settings(max_examples=300, **HYPO)
@given(cases(policies=("fcfs", "countdown", "trail-preemption"), predictors=("fixed",)))
def test_fixed_prefill_estimates_match_the_reference(case):
    """On time (published in the kernel), late (a SimPy event, published by Python) and both mixed,
    with chunked prefill and costs that delay estimates past a step's end."""
    cpu_s = [0.0, 0.3, 1.7, 0.004][case.seed % 4]
    tap = [1.0, 0.5, 0.8][case.seed % 3]
    case.chunked_prefill = case.seed % 5 == 0
    case.decodes_in_budget = case.seed % 7 == 0
    case.closed_loop = None    # a prefill-stage predictor in a closed loop is not compiled
    profile = UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")
    ref_predictor, comp_predictor = FixedPrefill(case.fixed, cpu_s, tap), FixedPrefill(case.fixed, cpu_s, tap)
    ref = simulate(case, "reference", profile, ref_predictor)
    assert_identical(ref, simulate(case, "compiled", profile, comp_predictor))
    if cpu_s == 0.0 and tap == 1.0:   # every estimate is ready at its step's end: none asked of Python
        assert comp_predictor.calls == 0 < ref_predictor.calls


@pytest.mark.parametrize(("predictor", "policy", "charge"), [("leap", "countdown", True), ("leap", "fcfs", True),
                                                             ("leap", "countdown", False),
                                                             ("egtp", "countdown", True)])
def test_frozen_readouts_on_a_recorded_trace_match_the_reference(predictor, policy, charge):
    def fixed(prepared):
        assert prepared.simulation.predictor.fixed_estimates() is not None

    replay_both(RunConfig(trace="sharegpt", predictor=predictor, policy=policy, load=1.5, charge_cost=charge,
                          predictor_options=PredictorOptions(train_trace="lmsys")), fixed)
