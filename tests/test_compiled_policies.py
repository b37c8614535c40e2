"""Aging and LTR's starvation rule run in the compiled kernel byte for byte (``simulator/kernel_policies.py``).

Aging's keys move when its clock ticks; LTR's per-row state changes only when the reference asks the
policy for keys. Hypothesis workloads run both kernels with the policies' parameters drawn so the
rules fire within a few steps (a clock of 0.3 s to 5 s, promotion after 0 to 8 idle steps), under
every way estimates reach the kernel (fixed, scored in Python at arrival, after prefill, learnt
online, refreshed), and LTR's final per-row state must match too; recorded traces at loads where
the rules fire (LTR with the wait cap off, so residents are promoted as well as waiting rows).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

from core.trace import trace_from_arrays  # noqa: E402
from policies.aging import Aging  # noqa: E402
from policies.base import SchedulerView  # noqa: E402
from policies.ltr_starvation import LTRStarvation  # noqa: E402
from simulator.compiled import unsupported  # noqa: E402
from simulator.engine import EngineConfig, Simulation  # noqa: E402
from simulator.profiles import make_profile  # noqa: E402
from simulator.profiles.unit import UnitProfile  # noqa: E402
from simulator.runner import RunConfig, run_simulation  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compiled import (  # noqa: E402
    OnlineLearning,
    QueueAwareCharged,
    Refreshing,
    assert_identical,
    replay_both,
)
from test_invariants import HYPO, cases, make_predictor_for, vllm_cases  # noqa: E402

POLICIES = ("aging", "ltr-starvation")
# (gamma, tau_s, recompute_s): the default, and clocks that tick every few steps with strong aging
AGING = st.tuples(st.sampled_from([0.9, 0.5, 0.01]), st.sampled_from([30.0, 2.0, 0.5]),
                  st.sampled_from([5.0, 1.0, 0.3, 2.5]))
# (idle_steps, runs): promotion within the small workloads' few steps, and the default
LTR = st.tuples(st.sampled_from([0, 1, 2, 3, 5, 8, 200]), st.sampled_from([0, 1, 2, 3, 10]))
LTR_STATE = ("runs_left", "served_seen", "first_waiting")


def make(policy: str, aging: tuple, ltr: tuple):
    return Aging(*aging) if policy == "aging" else LTRStarvation(*ltr)


def profile_of(case):
    return UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")


def both(case, policy: str, aging: tuple, ltr: tuple, predictor=lambda case: make_predictor_for(case), **sim_args):
    """The case on both kernels (the compiled one really running); results and LTR's state identical."""
    runs, policies = [], []
    for kernel in ("reference", "compiled"):
        wl = trace_from_arrays("hypo", case.prompt, case.output)
        pol = make(policy, aging, ltr)
        sim = Simulation(wl, np.asarray(case.arrival, dtype=np.float64), policy=pol, predictor=predictor(case),
                         profile=profile_of(case), config=case.config, seed=case.seed,
                         closed_loop=case.closed_loop, **sim_args)
        assert kernel == "reference" or unsupported(sim) is None
        runs.append(run_simulation(sim, kernel))
        policies.append(pol)
    assert_identical(*runs)
    if policy == "ltr-starvation":
        for name in LTR_STATE:
            assert getattr(policies[0], name).tobytes() == getattr(policies[1], name).tobytes(), name


@settings(max_examples=300, **HYPO)
@given(cases(policies=POLICIES, predictors=("oracle", "noisy", "fixed")), AGING, LTR)
def test_aging_and_ltr_compiled_match_reference(case, aging, ltr):
    case.decodes_in_budget = case.seed % 2 == 1
    both(case, case.policy, aging, ltr)


@settings(max_examples=150, **HYPO)
@given(vllm_cases(policies=POLICIES, predictors=("oracle", "noisy", "fixed")), AGING, LTR)
def test_aging_and_ltr_compiled_match_reference_under_vllm_v1_scheduling(case, aging, ltr):
    both(case, case.policy, aging, ltr)


@settings(max_examples=150, **HYPO)
@given(cases(policies=POLICIES, predictors=("fixed",)), AGING, LTR)
def test_aging_and_ltr_compiled_match_reference_with_python_scored_predictors(case, aging, ltr):
    """Admission ordered by scores computed in Python at each arrival (length or rank)."""
    output = "rank" if case.seed % 2 else "length"
    both(case, case.policy, aging, ltr, lambda case: QueueAwareCharged(case.fixed, output))


@settings(max_examples=150, **HYPO)
@given(cases(policies=POLICIES, predictors=("fixed",)), AGING, LTR, st.integers(1, 3),
       st.lists(st.sampled_from([0.0, 0.25, 1.0, 2.5, 7.0]), min_size=1, max_size=3).map(tuple))
def test_aging_and_ltr_compiled_match_reference_with_late_and_learnt_estimates(case, aging, ltr, batch, update_s):
    """Estimates after prefill (some after their step ends) and online updates that re-score the
    residents between steps: the kernel re-keys them with the policy's keys."""
    cpu_s = [0.0, 0.3, 1.7, 0.004][case.seed % 4]
    tap = [1.0, 0.5, 0.8][case.seed % 3]
    case.chunked_prefill = case.seed % 5 == 0
    both(case, case.policy, aging, ltr, lambda case: OnlineLearning(case.fixed, cpu_s, tap, batch, update_s))


@settings(max_examples=150, **HYPO)
@given(cases(policies=POLICIES, predictors=("fixed",)), AGING, LTR, st.integers(1, 5),
       st.sampled_from(["arrival", "prefill"]))
def test_aging_and_ltr_compiled_match_reference_with_refreshing_predictors(case, aging, ltr, every, stage):
    output = "rank" if case.seed % 3 == 0 else "length"
    case.chunked_prefill = case.seed % 5 == 0
    if stage == "prefill":
        case.closed_loop = None
    both(case, case.policy, aging, ltr, lambda case: Refreshing(case.fixed, output, every, stage))


def test_the_kernels_aged_key_is_the_references():
    """The kernel's key of one row (the policy's ``aged_key`` compiled in) and Aging.aged's (the same
    function row by row) equal the formula in numpy (libm's log) on scores <= 0, tiny and huge, waits
    clamped at 0, and keys whose 9th decimal is a half."""
    from simulator import kernel, kernel_policies

    kernel.load_kernel()   # the jitted helpers
    rng = np.random.default_rng(5)
    n = 20000
    score = np.concatenate([rng.uniform(0.5, 5000, n), [0.0, -3.0, 1e-320, 1e-300, 1e300, 1.0, 0.5]])
    arrival = np.concatenate([rng.uniform(0, 600, n), [0.0, 7.0, 1.0, 2.0, 3.0, 0.0, 5.0]])
    policy = Aging()
    for now in [0.0, 4.999, 5.0, 17.3, 600.0, 12345.6]:
        view = SchedulerView(now=now, arrival_s=arrival, predicted=score, generated=np.zeros(len(score), np.int64),
                             output_kind="rank")
        ref = policy.aged(view, np.arange(len(score)), score)
        clock = math.floor(now / policy.recompute_s) * policy.recompute_s
        comp = np.array([kernel_policies._aged(s, a, clock, policy._log_gamma_per_s) for s, a in zip(score, arrival)])
        floored = np.maximum(score, 1e-300).tolist()
        formula = np.fromiter(map(math.log, floored), dtype=np.float64) + policy._log_gamma_per_s * np.maximum(
            clock - arrival, 0.0)
        assert ref.tobytes() == comp.tobytes() == (np.rint(formula * 1e9) / 1e9).tobytes(), now
    # keys whose 9th decimal is exactly a half (x * 1e9 = k + 0.5): numpy rounds them to even, so must the kernel
    k = np.concatenate([np.arange(-50, 50), np.arange(10**6, 10**6 + 50)]) + 0.5
    halves = [x for x in (k / 1e9).tolist() if x * 1e9 == round(x * 1e9 - 0.5) + 0.5]
    keys = [kernel_policies._aged(1.0, 0.0, 1.0, x) for x in halves]   # log(1) + x * (1 - 0)
    assert len(halves) > 50 and keys == [float(np.round(x, 9)) for x in halves]
    assert any(key != math.floor(x * 1e9 + 0.5) / 1e9 for key, x in zip(keys, halves))   # not half up


def _count_promotions(monkeypatch) -> dict:
    """Count the reference's promotions of resident rows (decode) and waiting rows (admission): the
    rows whose promoted runs left rose at a call."""
    fired = {"decode": 0, "admission": 0}
    for kind in fired:
        original = getattr(LTRStarvation, f"{kind}_keys")

        def counted(self, view, rows, original=original, kind=kind):
            before = self.runs_left[rows].copy()
            keys = original(self, view, rows)
            fired[kind] += int((self.runs_left[rows] > before).sum())
            return keys

        monkeypatch.setattr(LTRStarvation, f"{kind}_keys", counted)
    return fired


@pytest.mark.parametrize(("predictor", "load"), [("ltr", 1.5), ("leap", 1.5)])
def test_ltr_starvation_compiled_on_a_recorded_trace(predictor, load, monkeypatch):
    """The wait cap off, so LTR's own rule promotes idle residents (and, with the arrival-stage
    ``ltr`` ranking ordering admission, long-waiting rows); both kernels end with the same state."""
    fired = _count_promotions(monkeypatch)
    states = []
    config = RunConfig(trace="sharegpt", predictor=predictor, policy="ltr-starvation", load=load,
                       engine_config=EngineConfig(wait_cap=0))
    replay_both(config, lambda prepared: states.append(prepared.simulation.policy))
    assert fired["decode"] > 1000 and (predictor == "leap" or fired["admission"] > 100), fired
    for name in LTR_STATE:
        assert getattr(states[0], name).tobytes() == getattr(states[1], name).tobytes(), name


@pytest.mark.parametrize(("predictor", "load"), [("oracle", 2.0), ("leap-rls", 1.5), ("ltr", 1.5)])
def test_aging_compiled_on_a_recorded_trace(predictor, load):
    """Aging at loads where it reorders (its finish times differ from countdown's on the same run),
    with a static oracle, LEAP+RLS's publishes re-keying residents, and LTR's rank ordering admission."""
    aged = replay_both(RunConfig(trace="sharegpt", predictor=predictor, policy="aging", load=load))
    countdown = replay_both(RunConfig(trace="sharegpt", predictor=predictor, policy="countdown", load=load))
    assert aged.finish_s.tobytes() != countdown.finish_s.tobytes()
