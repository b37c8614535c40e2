"""The compiled kernel keeps the reference's step log (``record_steps``) byte for byte.

Every column of :class:`simulator.engine.StepLog` (start, duration, admitted, decoded, forced,
ready, resident, waiting, arrived, finished, capacity left) from both kernels: the same dtypes and
bytes, on hypothesis workloads (with and without vLLM V1 scheduling, estimates fixed, published
after prefill or learnt online) and as a step-log file written from a recorded trace's run.
"""

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
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

from core.trace import trace_from_arrays  # noqa: E402
from policies import make_policy  # noqa: E402
from simulator.compiled import unsupported  # noqa: E402
from simulator.engine import Simulation  # noqa: E402
from simulator.profiles import make_profile  # noqa: E402
from simulator.profiles.unit import UnitProfile  # noqa: E402
from simulator.runner import RunConfig, execute, prepare, run_simulation  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compiled import OnlineLearning, PrefillStage, assert_identical  # noqa: E402
from test_invariants import HYPO, cases, make_predictor_for, vllm_cases  # noqa: E402


def assert_same_log(ref, comp) -> None:
    a, b = ref.step_log.as_arrays(), comp.step_log.as_arrays()
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].tobytes() == b[name].tobytes(), name
    assert len(a["start_s"]) == ref.steps


def run(case, kernel: str, estimates: str):
    wl = trace_from_arrays("hypo", case.prompt, case.output)
    if estimates == "prefill" and case.fixed is not None:
        predictor = PrefillStage(case.fixed, 0.3, 0.5)
    elif estimates == "online" and case.fixed is not None:
        predictor = OnlineLearning(case.fixed, 0.004, 0.8, 2, (0.25, 1.0))
    else:
        predictor = make_predictor_for(case)
    sim = Simulation(wl, np.asarray(case.arrival, dtype=np.float64), policy=make_policy(case.policy),
                     predictor=predictor, profile=UnitProfile() if case.step_time == "unit"
                     else make_profile("qwen3-8b-h100"), config=case.config, seed=case.seed,
                     closed_loop=case.closed_loop, record_steps=True)
    assert kernel == "reference" or unsupported(sim) is None
    return run_simulation(sim, kernel)


@settings(max_examples=300, **HYPO)
@given(st.one_of(cases(policies=("fcfs", "countdown", "trail-preemption")),
                 vllm_cases(policies=("fcfs", "countdown", "trail-preemption"))),
       st.sampled_from(["as drawn", "prefill", "online"]))
def test_step_log_is_byte_identical(case, estimates):
    ref, comp = run(case, "reference", estimates), run(case, "compiled", estimates)
    assert_identical(ref, comp)
    assert_same_log(ref, comp)


def test_step_log_grows_across_kernel_calls(monkeypatch):
    """More steps than the log first holds and than one kernel call runs (its arrays grown between calls)."""
    from simulator import compiled

    monkeypatch.setattr(compiled, "CHUNK_STEPS", 97)
    config = RunConfig(trace="sharegpt-lengths", predictor="oracle", policy="countdown", load=1.5, requests=1500)
    runs = []
    for kernel in ("reference", "compiled"):
        _, result = execute(prepare(dataclasses.replace(config, kernel=kernel), record_steps=True))
        runs.append(result)
    assert runs[0].steps > 2000
    assert_identical(*runs)
    assert_same_log(*runs)


def test_step_log_files_are_byte_identical(tmp_path):
    """A step log written as a parquet file: the same file from both kernels (LEAP+RLS on alpaca at
    1.5x, its publishes between compiled steps)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    config = RunConfig(trace="alpaca", predictor="leap-rls", policy="countdown", load=1.5)
    files = []
    for kernel in ("reference", "compiled"):
        prepared = prepare(dataclasses.replace(config, kernel=kernel), record_steps=True)
        assert kernel == "reference" or unsupported(prepared.simulation) is None
        _, result = execute(prepared)
        path = tmp_path / f"{kernel}.steps.parquet"
        pq.write_table(pa.table(result.step_log.as_arrays()), path)
        files.append(path.read_bytes())
    assert files[0] == files[1]
    assert result.steps > 1000 and result.updates_published > 10
