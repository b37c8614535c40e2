"""LEAP+RLS's estimate rule is written once (:mod:`predictors.leap.online_rule`): compiled or plain
Python it gives the same bits, and the kernel's prefill estimates from it
(:mod:`simulator.kernel_online`) replay the reference engine byte for byte."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the rule runs as plain Python only", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compiled import assert_identical  # noqa: E402
from test_invariants import HYPO  # noqa: E402

from predictors.leap import online_rule  # noqa: E402


def plain_rule():
    spec = importlib.util.spec_from_file_location("online_rule_plain", online_rule.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@settings(max_examples=80, **HYPO)
@given(st.integers(0, 2**31), st.integers(1, 40), st.integers(1, 19), st.booleans(), st.floats(0.5, 40.0))
def test_compiled_rule_gives_the_plain_python_bits(seed, n, d, square, hi):
    """Every width (the four partial sums and the tail), clipped or not, both targets."""
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, d)).astype(np.float32)
    theta = rng.normal(scale=hi / 2, size=d + 1)
    rows = rng.integers(0, n, size=n).astype(np.int64)
    args = (Z, rows, theta, square, -0.25 * hi, hi, hi * hi * 0.9)
    compiled = online_rule.estimates(*args)
    assert hasattr(online_rule.estimate_rows, "py_func")
    plain = np.empty(n)
    plain_rule().estimate_rows(*args[:-1], args[-1], plain)
    assert compiled.tobytes() == plain.tobytes()


@pytest.mark.parametrize(("trace", "load", "charge"), [("sharegpt", 1.5, True), ("alpaca", 2.0, False),
                                                       ("multilingual", 1.0, True)])
def test_leap_rls_prefill_estimates_in_the_kernel_match_the_reference(trace, load, charge):
    """The recorded trace's LEAP+RLS: the same bytes on both kernels, with the prefill estimates
    made in compiled code (Python predicts only at publishes and for late estimates). The step
    clock: ``test_compiled.py::test_compiled_matches_reference_on_the_step_clock_with_leap``."""
    from simulator.runner import RunConfig, execute, prepare

    config = RunConfig(trace=trace, predictor="leap-rls", policy="countdown", load=load, charge_cost=charge)
    runs, calls = {}, {}
    for kernel in ("reference", "compiled"):
        prepared = prepare(dataclasses.replace(config, kernel=kernel))
        predictor = prepared.simulation.predictor
        calls[kernel] = [0]
        predict = predictor.predict

        def counted(*a, predict=predict, count=calls[kernel], **k):
            count[0] += 1
            return predict(*a, **k)
        predictor.predict = counted
        summary, result = execute(prepared)
        summary.pop("sim_cpu_s")
        runs[kernel] = summary, result
        if kernel == "compiled":
            assert result.updates_published > 0
    assert repr(runs["reference"][0]) == repr(runs["compiled"][0])
    assert_identical(runs["reference"][1], runs["compiled"][1])
    assert calls["compiled"][0] < calls["reference"][0] / 2
