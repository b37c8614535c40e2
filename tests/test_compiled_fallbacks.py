"""What happens where the compiled kernel does not run: a configuration it does not cover says so
and uses the reference engine, an unknown kernel is refused, a machine without numba runs the
reference, ``simulate --kernel`` writes the same files either way; and the kernel's float helpers
equal CPython's and numpy's bit for bit (the byte-identity tests: tests/test_compiled.py).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

# numba itself is imported only when a test runs the kernel (not at collection): once loaded, it
# trips vLLM 0.32's dispatcher scan in a vLLM engine started later in the same process
if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

from core.trace import trace_from_arrays  # noqa: E402
from simulator.engine import Simulation  # noqa: E402
from simulator.profiles.unit import UnitProfile  # noqa: E402
from simulator.runner import RunConfig, execute, prepare, run_simulation  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_compiled import REGISTRY_CONFIG, assert_identical  # noqa: E402


def test_unsupported_configuration_says_so_and_uses_the_reference(capsys):
    """A policy without a compiled form (every registered one has one) runs on the reference engine."""
    from policies.countdown import Countdown
    from predictors.oracle import Oracle
    from simulator.compiled import note_fallback

    class Uncompiled(Countdown):
        name = "uncompiled"
        compiled, why_not = False, {"compiled": "a test says so"}

        def compiled_form(self):
            return None

    note_fallback.cache_clear()
    workload = trace_from_arrays("fallback", [20] * 40, list(range(1, 41)))
    runs = [run_simulation(Simulation(workload, np.arange(40) * 0.01, policy=Uncompiled(), predictor=Oracle(),
                                      profile=UnitProfile(), config=REGISTRY_CONFIG), kernel)
            for kernel in ("reference", "compiled", "compiled")]
    err = capsys.readouterr().err
    assert "--kernel compiled: policy 'uncompiled' is not compiled: a test says so (fcfs, countdown, aging" in err
    assert err.count("--kernel compiled") == 1   # said once per process
    assert_identical(runs[0], runs[1])


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="unknown kernel"):
        RunConfig(trace="sharegpt-lengths", kernel="fast")


def test_without_numba_compiled_runs_the_reference(monkeypatch, capsys):
    from simulator import compiled

    monkeypatch.setattr(compiled, "load_kernel", lambda: None)
    compiled.note_fallback.cache_clear()
    config = RunConfig(trace="sharegpt-lengths", predictor="oracle", policy="countdown", load=1.0, requests=200,
                       kernel="reference")
    _, ref = execute(prepare(config))
    _, comp = execute(prepare(dataclasses.replace(config, kernel="compiled")))
    assert "--kernel compiled: numba is missing or fails to load; uses the reference engine" \
        in capsys.readouterr().err
    assert_identical(ref, comp)


def test_simulate_kernel_flag_writes_identical_files(tmp_path):
    import json

    from experiments.cli import main

    outs = {}
    for kernel in ("reference", "compiled"):
        out = tmp_path / kernel
        assert main(["--trace", "sharegpt-lengths", "--requests", "300", "--predictor", "oracle", "--policy",
                     "countdown", "--load", "1.5x", "--kernel", kernel, "--out", str(out), "--quiet"]) == 0
        outs[kernel] = out
    ref, comp = outs["reference"], outs["compiled"]
    assert (ref / "requests.parquet").read_bytes() == (comp / "requests.parquet").read_bytes()
    summaries = [json.loads((d / "summary.json").read_text()) for d in (ref, comp)]
    for summary in summaries:
        summary.pop("sim_cpu_s", None)
    assert summaries[0] == summaries[1]
    assert (ref / "config.json").read_bytes() == (comp / "config.json").read_bytes()   # the kernel is not recorded


def test_float_helpers_replicate_python_and_numpy():
    """The kernel's hypot is CPython's math.hypot and its sum numpy's pairwise sum, bit for bit."""
    import math

    from simulator import kernel, kernel_float

    kernel.load_kernel()   # the jitted helpers
    rng = np.random.default_rng(7)
    a = rng.uniform(0, 1, 20000) * 10.0 ** rng.integers(-8, 3, 20000)
    b = rng.uniform(0, 1, 20000) * 10.0 ** rng.integers(-8, 3, 20000)
    assert all(kernel_float._py_hypot(x, y) == math.hypot(x, y) for x, y in zip(a, b))
    stack, sums = np.zeros((3, 64), dtype=np.int64), np.empty(64, dtype=np.float64)
    for n in [*range(1, 300), 1000, 4099]:
        v = np.abs(rng.normal(0, 100, n))
        assert kernel_float._pairwise(v, 0, n, stack, sums) == float(v.sum())
