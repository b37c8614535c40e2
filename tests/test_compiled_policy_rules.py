"""The rule policies without a prediction of their own (mlfq, boost, priority, edf) run in the
compiled kernel byte for byte: hypothesis workloads with their settings drawn so the rules bite
(small quanta, boosts from FCFS-like to SJF-like, priority classes, tight and loose SLOs), with and
without a predictor (boost reads a length predictor's remaining estimate), and the bundled sharegpt
trace at 1.5x with LEAP+RLS. MLFQ's and EDF's keys rise when a row decodes (``keys_rise``): a
kernel that re-sorted only the decoded prefix fails here."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

from core.trace import trace_from_arrays  # noqa: E402
from policies import make_policy  # noqa: E402
from simulator.compiled import unsupported  # noqa: E402
from simulator.engine import Simulation  # noqa: E402
from simulator.profiles import make_profile  # noqa: E402
from simulator.profiles.unit import UnitProfile  # noqa: E402
from simulator.runner import RunConfig, run_simulation  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compiled import assert_identical, replay_both  # noqa: E402
from test_invariants import HYPO, cases, make_predictor_for  # noqa: E402

RULE_POLICIES = ("mlfq", "boost", "priority", "edf")
MLFQ = st.fixed_dictionaries({"quantum": st.sampled_from([1, 2, 3, 16]), "levels": st.sampled_from([1, 2, 4, 6]),
                              "entry_tokens": st.sampled_from([1, 8, 20, 256])})
BOOST = st.fixed_dictionaries({"gamma": st.sampled_from([0.001, 0.05, 1.0, 50.0]),
                               "token_s": st.sampled_from([0.01, 0.025, 1.0])})
EDF = st.sampled_from([(("ttft", 500.0), ("tpot", 50.0)), (("tpot", 300.0),), (("e2el", 4000.0),),
                       (("ttft", 2000.0), ("e2el", 3000.0)), (("ttft", 1.0), ("tpot", 1.0), ("e2el", 1.0))])


def build(policy: str, data):
    if policy == "mlfq":
        return make_policy("mlfq", data.draw(MLFQ).items())
    if policy == "boost":
        return make_policy("boost", data.draw(BOOST).items())
    if policy == "edf":
        return make_policy("edf", slos=data.draw(EDF))
    return make_policy(policy)


def both(case, policy: str, data):
    drawn = build(policy, data)
    settings_of = drawn.describe()
    priorities = np.asarray(data.draw(st.lists(st.integers(-2, 2), min_size=len(case.prompt),
                                               max_size=len(case.prompt))), dtype=np.int64)
    runs = []
    for kernel in ("reference", "compiled"):
        wl = trace_from_arrays("hypo", case.prompt, case.output)
        wl = dataclasses.replace(wl, table=wl.table.append_column("priority", pa.array(priorities, pa.int64())))
        sim = Simulation(wl, np.asarray(case.arrival, dtype=np.float64), policy=type(drawn)(**_kwargs(drawn)),
                         predictor=make_predictor_for(case),
                         profile=UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100"),
                         config=case.config, seed=case.seed, closed_loop=case.closed_loop)
        assert kernel == "reference" or unsupported(sim) is None, settings_of
        runs.append(run_simulation(sim, kernel))
    assert_identical(*runs)


def _kwargs(policy) -> dict:
    if policy.name == "edf":
        return {"slos": policy.slos}
    return {k: getattr(policy, k) for k in policy.settings_defaults}


@pytest.mark.parametrize("policy", RULE_POLICIES)
@settings(max_examples=60, **HYPO)
@given(case=cases(policies=("fcfs",), predictors=("none", "oracle", "noisy")), data=st.data())
def test_rule_policies_compiled_equal_the_reference(policy, case, data):
    both(case, policy, data)


@pytest.mark.parametrize(("policy", "predictor", "setting"), [
    ("mlfq", "none", ()), ("boost", "none", ()), ("boost", "leap-rls", ()),
    ("boost", "leap-rls", (("gamma", 0.5),)), ("edf", "none", ()), ("priority", "none", ())])
def test_rule_policies_compiled_equal_the_reference_on_sharegpt(policy, predictor, setting):
    replay_both(RunConfig(trace="sharegpt", predictor=predictor, policy=policy, load=1.5, requests=1500,
                          policy_options=setting, goodput=(("ttft", 2000.0), ("tpot", 100.0))))
