"""SSJF's starvation override runs in the compiled kernel byte for byte (``CompiledForm.starve_after_s``).

The override orders a decision by arrival when its longest-waiting row has waited too long; the
kernel reads it from the policy's declared compiled form. Hypothesis workloads on both kernels
(arrival-stage scores: the override also orders admission; prefill-stage estimates, some late),
and a fixed workload on which the override is seen to fire in both decode choice and admission.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

from core.trace import trace_from_arrays  # noqa: E402
from policies import make_policy  # noqa: E402
from policies.ssjf_starvation import SSJFStarvation  # noqa: E402
from simulator.compiled import unsupported  # noqa: E402
from simulator.engine import EngineConfig, Simulation  # noqa: E402
from simulator.profiles import make_profile  # noqa: E402
from simulator.profiles.unit import UnitProfile  # noqa: E402
from simulator.runner import run_simulation  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compiled import PrefillStage, assert_identical, simulate  # noqa: E402
from test_invariants import HYPO, FixedPredictor, cases  # noqa: E402


@settings(max_examples=200, **HYPO)
@given(cases(policies=("ssjf-starvation",), predictors=("oracle", "noisy", "fixed")))
def test_ssjf_starvation_compiled_matches_reference(case):
    case.decodes_in_budget = case.seed % 2 == 1
    profile = UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")
    assert_identical(simulate(case, "reference", profile), simulate(case, "compiled", profile))


@settings(max_examples=100, **HYPO)
@given(cases(policies=("ssjf-starvation",), predictors=("fixed",)))
def test_ssjf_starvation_compiled_matches_reference_with_prefill_stage_estimates(case):
    cpu_s = [0.0, 0.3, 1.7][case.seed % 3]
    case.chunked_prefill = case.seed % 5 == 0
    profile = UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")
    ref = simulate(case, "reference", profile, PrefillStage(case.fixed, cpu_s, 0.5))
    assert_identical(ref, simulate(case, "compiled", profile, PrefillStage(case.fixed, cpu_s, 0.5)))


def test_the_override_fires_in_decode_and_admission_and_the_kernel_follows(monkeypatch):
    """Long requests scored short: the first waits past 10 x its predicted time, so decisions flip
    to arrival order; the reference's calls show both kinds fired, the kernel gives the same bytes."""
    n = 30
    rng = np.random.default_rng(3)
    output = rng.integers(5, 60, n)
    workload = trace_from_arrays("starve", rng.integers(5, 40, n).tolist(), output.tolist())
    arrival = np.arange(n) * 0.5
    scores = (n - np.arange(n)).astype(float)     # later arrivals look shorter: the early ones wait
    fired = {"decode": 0, "admission": 0}
    original = SSJFStarvation.starving

    def counted(kind):
        def keys(self, view, rows):
            fired[kind] += bool(original(self, view, rows))
            return getattr(SSJFStarvation, f"_{kind}_keys")(self, view, rows)
        return keys

    runs = {}
    for kernel in ("reference", "compiled"):
        sim = Simulation(workload, arrival, policy=make_policy("ssjf-starvation"), predictor=FixedPredictor(scores),
                         profile=UnitProfile(), config=EngineConfig(max_resident=6, decode_slots=2,
                                                                    prefill_token_budget=60, wait_cap=0))
        if kernel == "compiled":
            assert unsupported(sim) is None
        else:
            monkeypatch.setattr(SSJFStarvation, "_decode_keys", SSJFStarvation.decode_keys, raising=False)
            monkeypatch.setattr(SSJFStarvation, "_admission_keys", SSJFStarvation.admission_keys, raising=False)
            monkeypatch.setattr(SSJFStarvation, "decode_keys", counted("decode"))
            monkeypatch.setattr(SSJFStarvation, "admission_keys", counted("admission"))
        runs[kernel] = run_simulation(sim, kernel)
        monkeypatch.undo()
    assert fired["decode"] > 0 and fired["admission"] > 0, fired
    assert_identical(runs["reference"], runs["compiled"])
