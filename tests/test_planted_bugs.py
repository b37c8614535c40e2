"""Assertions for places where a one-token bug used to pass every test: each test below pins one
formula or rule by hand-computed values, so that changing a sign, an index or an operand fails
it (docs/semantics.md defines the engine rules they check)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.importers import import_table
from core.patience import scaled
from core.trace import TraceError, load_trace, trace_from_arrays, trace_metadata
from experiments.replay_errors import replay_errors
from experiments.steps_rebuild import main as rebuild_main
from experiments.sweep import completed_summary, run_one
from policies import make_policy
from predictors.base import Predictor, PredictorCost
from simulator.engine import EngineConfig, Simulation
from simulator.profiles.unit import UnitProfile
from simulator.runner import RunConfig, run_simulation
from simulator.workload import ArrivalSpec, recorded_arrivals


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


# ------------------------------------------------------------------ validation error formulas


def test_replay_error_figures_by_hand():
    row = {"real_p95_e2e_s": 2.0, "sim_p95_e2e_s": 3.0, "real_mean_e2e_s": 4.0, "sim_mean_e2e_s": 3.0,
           "real_mean_ptl_s": 0.5, "sim_mean_ptl_s": 0.4, "real_makespan_s": 10.0, "sim_makespan_s": 12.0}
    errors = replay_errors(row, sim_e2e=[1.0, 3.0, 8.0], real_e2e=[2.0, 2.0, 4.0])
    # per request |sim - real| / real = 0.5, 0.5, 1.0: the median is 0.5 (the mean would be 2/3)
    assert errors == pytest.approx({"p95_e2e_err": 0.5, "mean_e2e_err": -0.25, "mean_ptl_err": -0.2,
                                    "makespan_err": 0.2, "median_abs_e2e_err": 0.5}, rel=1e-12)


# ------------------------------------------------------------------ the columns rebuild_steps writes


def _closed_loop_recording(tmp_path):
    """One closed-loop run by hand: request 0 (prompt 10, 2 tokens) and request 1 (prompt 3, 1 token),
    2 sequences, a budget of 6 tokens per step, both submitted at once.
    step 0: r0 prefills 6 of 10 (attention 6 x 6 = 36)
    step 1: r0 prefills its last 4 (4 x (6 + 4) = 40) and emits its first token; r1 gets 2 of 3 (2 x 2)
    step 2: r0 decodes (context 10 + 1 = 11) and finishes; r1 prefills its last token (1 x 3), emits, finishes
    """
    path = tmp_path / "rec.parquet"
    meta = {"backend_details": {"engine_args": {"max_num_seqs": 2, "max_num_batched_tokens": 6}, "window": 2},
            "runs": [{"run": 0, "requests": 2}]}
    pq.write_table(pa.table({
        "request_id": ["r0", "r1"], "domain": ["d", "d"], "prompt_id": ["p0", "p1"],
        "prompt_tokens": pa.array([10, 3], pa.int32()), "output_tokens": pa.array([2, 1], pa.int32()),
        "finish_reason": ["length", "length"], "max_tokens": pa.array([2, 1], pa.int32()),
    }).replace_schema_metadata(trace_metadata(**meta)), path)
    steps = pa.table({
        "run": pa.array([0, 0, 0], pa.int64()), "run_step": pa.array([0, 1, 2], pa.int64()),
        "prefill_requests": pa.array([1, 2, 1], pa.int64()), "prefill_tokens": pa.array([6, 6, 1], pa.int64()),
        "decode_requests": pa.array([0, 0, 1], pa.int64()), "decode_tokens": pa.array([0, 0, 1], pa.int64()),
        "wall_start_s": [0.0, 1.0, 2.5], "step_s": [0.5, 1.25, 0.5],
    })
    pq.write_table(steps, tmp_path / "rec.steps.parquet")
    return path


@pytest.mark.parametrize("replace", [False, True])
def test_rebuild_steps_columns_by_hand_and_a_new_file_unless_replace(replace, tmp_path, capsys):
    path = _closed_loop_recording(tmp_path)
    original = (tmp_path / "rec.steps.parquet").read_bytes()
    assert rebuild_main([str(path)] + (["--replace"] if replace else [])) == 0
    report = json.loads(capsys.readouterr().out)
    written = tmp_path / ("rec.steps.parquet" if replace else "rec.steps.rebuilt.parquet")
    assert report["written"] == written.name and report["match_rate"] == 1.0
    if not replace:
        assert (tmp_path / "rec.steps.parquet").read_bytes() == original
    table = pq.read_table(written)
    assert table.column("prefill_sq").to_pylist() == [36, 40 + 4, 3]
    assert table.column("decode_context").to_pylist() == [0, 0, 11]
    assert table.column("host_gap_s").to_pylist() == [0.5, 0.25, None]   # next start - (start + step_s)
    assert table.column("rebuilt_exact").to_pylist() == [True, True, True]


def test_a_profile_fitted_without_the_rebuilt_columns_says_so(tmp_path, capsys):
    from simulator.profiles.fitted import FittedProfile

    rng = np.random.default_rng(0)
    steps = pa.table({"prefill_tokens": rng.integers(0, 100, 50), "decode_requests": rng.integers(0, 8, 50),
                      "step_s": rng.uniform(0.01, 0.02, 50)})
    FittedProfile.fit(steps, source=str(tmp_path / "old"))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"{tmp_path / 'old'}.steps.parquet" in err[0], err
    assert "decode_context, prefill_sq, host_gap_s" in err[0] and "reduced model" in err[0]


# ------------------------------------------------------------------ the sweep's resume key


SMALL = EngineConfig(max_resident=8, decode_slots=4)


@pytest.mark.parametrize("change", [
    {"charge_cost": False},
    {"engine_config": dataclasses.replace(SMALL, decode_slots=2)},
    {"engine_config": dataclasses.replace(SMALL, wait_cap=7)},
    {"engine_config": dataclasses.replace(SMALL, prefill_token_budget=4096)},
])
def test_a_stored_run_is_reused_only_for_the_same_settings(change, tmp_path):
    config = RunConfig(trace="sharegpt-lengths", predictor="oracle", policy="countdown", engine="qwen3-8b-h100",
                       load=1.0, arrivals=ArrivalSpec.parse("poisson"), requests=30, seed=0, engine_config=SMALL)
    run_one(config, str(tmp_path))
    assert completed_summary(config, tmp_path) is not None                    # the same run is reused
    assert completed_summary(dataclasses.replace(config, **change), tmp_path) is None


# ------------------------------------------------------------------ the trace contract and importers


@pytest.mark.parametrize("column, values", [("arrival_s", [0.0, -1.0]), ("ttft_s", [0.1, -0.5]),
                                            ("e2e_s", [-2.0, 1.0])])
def test_negative_times_break_the_trace_contract(column, values, tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({
        "request_id": ["a", "b"], "domain": ["d", "d"], "prompt_id": ["a", "b"],
        "prompt_tokens": pa.array([5, 5], pa.int32()), "output_tokens": pa.array([3, 3], pa.int32()),
        "finish_reason": ["stop", "stop"], "max_tokens": pa.array([8, 8], pa.int32()),
        column: pa.array(values, pa.float64()),
    }).replace_schema_metadata(trace_metadata()), path)
    row = int(np.argmin(values))
    with pytest.raises(TraceError, match=rf"column {column}: row {row}: .* not a finite, non-negative time"):
        load_trace(path)


def test_imported_times_start_at_the_earliest_kept_row(tmp_path):
    """Rows dropped for 0 tokens do not set the time origin: the first kept request arrives at 0."""
    path = tmp_path / "counts.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n1.0,0,5\n4.0,10,0\n9.0,10,5\n6.5,7,2\n")
    imported = import_table(path)
    assert imported.table.column("arrival_s").to_pylist() == [2.5, 0.0]
    assert imported.table.column("request_id").to_pylist() == ["counts-000002", "counts-000003"]


def test_recorded_arrivals_start_at_the_earliest_not_the_first_row():
    trace = trace_from_arrays("late-first", [5, 5, 5], [3, 3, 3], arrival_s=[5.0, 2.0, 3.5])
    assert recorded_arrivals(trace).tolist() == [3.0, 0.0, 1.5]


# ------------------------------------------------------------------ predictor costs


class _PrefillCost(Predictor):
    """A prefill-stage predictor with a GPU cost per call, per request and per prompt token."""

    name = "prefill-cost"
    stage = "prefill"

    def predict(self, rows, known=None):
        return np.full(len(rows), 3.0)

    def cost(self, hardware=None):
        return PredictorCost(gpu_s_per_call=0.5, gpu_s_per_request=0.25, gpu_s_per_prompt_token=0.01)


def test_gpu_cost_counts_each_request_and_prompt_token():
    cost = PredictorCost(gpu_s_per_call=1.0, gpu_s_per_request=10.0, gpu_s_per_prompt_token=100.0)
    assert cost.gpu_s(3, 7) == 1.0 + 3 * 10.0 + 7 * 100.0
    assert cost.gpu_s(0, 0) == 0.0


@pytest.mark.parametrize("charge", [True, False])
def test_a_prefill_stage_predictor_is_charged_per_admitted_request_unless_not_charged(charge):
    """Four prompts of 4 tokens admitted in one step: 0.5 + 4 x 0.25 + 16 x 0.01 = 1.66 s on the
    unit profile's 1 s step (first tokens at 2.66 s), and nothing with charge_cost=False."""
    trace = trace_from_arrays("cost", [4] * 4, [2] * 4)
    result = Simulation(trace, np.zeros(4), policy=make_policy("countdown"), predictor=_PrefillCost(),
                        profile=UnitProfile(), config=EngineConfig(), charge_cost=charge).run()
    gpu = 0.5 + 4 * 0.25 + 16 * 0.01
    assert result.gpu_s_charged == pytest.approx(gpu if charge else 0.0)
    assert result.first_token_s.tolist() == pytest.approx([1.0 + (gpu if charge else 0.0)] * 4)


# ------------------------------------------------------------------ chunked prefill: progress or a stall


@pytest.mark.parametrize("kernel", ["reference", "compiled"])
def test_chunked_prefill_advances_a_long_prompt_every_step(kernel):
    """20 prompt tokens through a 6-token budget: 6 + 6 + 6 + 2, the first token at the end of the
    4th step, the second one step later (a bug that does not advance the prompt now stalls)."""
    if kernel == "compiled":
        pytest.importorskip("numba", reason="the compiled kernel needs numba (extra `fast`)")
    trace = trace_from_arrays("long", [20, 3], [2, 1], arrival_s=[0.0, 0.0])
    sim = Simulation(trace, np.zeros(2), policy=make_policy("fcfs"), predictor=None, profile=UnitProfile(),
                     config=EngineConfig(prefill_token_budget=6, chunked_prefill=True))
    result = run_simulation(sim, kernel)
    assert result.first_token_s.tolist() == [4.0, 4.0]   # the short prompt fits in the 4th step's 4 tokens left
    assert result.finish_s.tolist() == [5.0, 4.0]


def test_a_step_that_leaves_a_carried_prompt_where_it_was_is_a_stall(monkeypatch):
    from simulator.scheduler import Scheduler, SimulationStalled

    real = Scheduler._prefill

    def stuck(self, admit, budget, carried, carried_chunk):
        if carried >= 0:   # the carried chunk is reported, but the prompt does not advance
            return np.zeros(0, np.int64), carried_chunk, 0
        return real(self, admit, budget, carried, carried_chunk)

    monkeypatch.setattr(Scheduler, "_prefill", stuck)
    trace = trace_from_arrays("long", [20], [2])
    with pytest.raises(SimulationStalled, match=r"made no progress: the part-prefilled prompt of row 0 stayed at 6 of 20"):
        Simulation(trace, np.zeros(1), policy=make_policy("fcfs"), predictor=None, profile=UnitProfile(),
                   config=EngineConfig(prefill_token_budget=6, chunked_prefill=True)).run()


#: a long prompt continued in chunks while another request decodes every step (so no step is idle and
#: the no-progress stall never fires): a chunk that forgets the part computed before it would loop
#: until the decoder's million tokens ran out (many minutes)
_FORGETFUL_RUN = """
import sys
import numpy as np
from policies import make_policy
from core.trace import trace_from_arrays
from simulator.engine import EngineConfig, Simulation
from simulator.profiles.unit import UnitProfile
from simulator.runner import run_simulation
from simulator.scheduler import SimulationStalled

def run(kernel):
    trace = trace_from_arrays("forget", [3, 20], [1_000_000, 2], arrival_s=[0.0, 0.0])
    try:
        sim = Simulation(trace, np.zeros(2), policy=make_policy("fcfs"), predictor=None, profile=UnitProfile(),
                         config=EngineConfig(prefill_token_budget=6, chunked_prefill=True))
        run_simulation(sim, kernel)
    except SimulationStalled as stalled:
        return str(stalled)
    return "no error"
"""
_OVERRUN = (r"the prompt of row 1 \(20 tokens\) is still part-prefilled \(6 computed\) after 5 continued chunks "
            r"of at least 6 tokens; at most 4 can be needed")


def test_a_chunk_that_forgets_earlier_chunks_fails_fast_with_a_named_stall(monkeypatch):
    """Reference engine: the planted bug (each continued chunk starts from 0 again) stops the run at
    the 5th continued chunk of a 20-token prompt through a 6-token budget (ceil(20/6) = 4 at most)."""
    from simulator.scheduler import Scheduler

    real = Scheduler._prefill

    def forgets(self, admit, budget, carried, carried_chunk):
        if carried >= 0:
            self.table.prefilled[carried] = 0   # the planted bug: what earlier chunks computed is lost
        return real(self, admit, budget, carried, carried_chunk)

    monkeypatch.setattr(Scheduler, "_prefill", forgets)
    namespace: dict = {}
    exec(_FORGETFUL_RUN, namespace)
    assert re_search(_OVERRUN, namespace["run"]("reference"))


@pytest.mark.timeout(600)   # compiles the planted kernel once (about a CPU-minute)
def test_the_compiled_kernel_bounds_continued_chunks_too(tmp_path):
    """The same planted bug in the kernel's _prefill (kernel_steps: ``+=`` made ``=``), planted in a
    copy of simulator/ (numba compiles source files, so it cannot be monkeypatched) and run in a fresh
    process beside the other packages: the same named stall, from the kernel's overrun status."""
    pytest.importorskip("numba", reason="the compiled kernel needs numba (extra `fast`)")
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    copy = tmp_path / "checkout"
    copy.mkdir()
    shutil.copytree(root / "simulator", copy / "simulator", ignore=shutil.ignore_patterns("__pycache__"))
    for package in ("core", "policies", "predictors", "experiments", "live", "capture", "leap_sched", "traces"):
        if (root / package).exists():
            (copy / package).symlink_to(root / package)
    steps = copy / "simulator" / "kernel_steps.py"
    source = steps.read_text()
    correct = "        t.prefilled[carried] += chunk_c\n"
    assert source.count(correct) == 1
    steps.write_text(source.replace(correct, "        t.prefilled[carried] = chunk_c\n"))   # the planted bug
    env = dict(os.environ, PYTHONPATH=str(copy), LEAP_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NUMBA_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", _FORGETFUL_RUN + "\nprint(run('compiled'))\n"], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=scaled(540))
    assert done.returncode == 0, done.stderr
    assert re_search(_OVERRUN, done.stdout.strip().splitlines()[-1]), done.stdout


def re_search(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern, text) is not None


# ------------------------------------------------------------------ the compiled kernel's rules, directly


def test_countdown_rule_floors_fractional_remaining_lengths():
    """policies.countdown.decode_key, the key both kernels compute: predicted - generated, floored at
    0.5; a rank predictor's score as it is."""
    from core.attributes import defaults
    from policies.countdown import decode_key
    from policies.rule import RuleRows

    predicted = np.array([3.7, 2.2, 10.25, 4.0, 1.5])
    generated = np.array([3, 2, 2, 4, 1])
    t = RuleRows(predicted, generated, np.zeros(5), np.full(5, np.nan), defaults(5))
    keys = [decode_key(r, t, False) for r in range(5)]
    assert keys == pytest.approx([0.7, 0.5, 8.25, 0.5, 0.5], abs=1e-12)
    assert [decode_key(r, t, True) for r in range(2)] == [3.7, 2.2]


def test_kernel_trail_lock_boundary():
    """kernel_rank._locked (policies.trail_preemption.locked_row, both kernels' test): decoded in the
    previous step and generated strictly past c x its first estimate."""
    from simulator.kernel_rank import _locked

    first = np.array([10.0, 10.0, 10.0, 10.0, 7.5])
    generated = np.array([8, 9, 9, 20, 6])
    last_served = np.array([4, 4, 3, 5, 4])
    c = 0.8    # limits: 8, 8, 8, 8, 6
    locked = [_locked(r, 5, c, last_served, generated, first) for r in range(5)]
    assert locked == [False, True, False, False, False]
