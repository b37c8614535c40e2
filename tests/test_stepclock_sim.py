"""The step clock on the simulator side (docs/semantics.md, "Step clock"): a hand-worked example on
both kernels, the step columns of every requests.parquet, ``simulate --arrivals steps`` on a
step-clocked serving trace, ``leap-validate`` on it, and the refusals."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.trace import load_trace, trace_from_arrays, trace_metadata
from experiments.cli import main as simulate_main
from experiments.validate import main as validate_main
from experiments.validate_steps import compare_steps, replay_steps, validate_step_run
from policies import make_policy
from simulator.engine import EngineConfig, Simulation
from simulator.profiles.unit import UnitProfile
from simulator.runner import run_simulation

KERNELS = ["reference"] + (["compiled"] if importlib.util.find_spec("numba") else [])

# The worked example: 2 resident, 1 decode slot, 100 tokens per step shared by decodes and chunks.
#   tick 0: A (50) and B's first 50-token chunk are prefilled: A's first token.
#   tick 1: A decodes (1 token of the budget), B's last 30 tokens: B's first token.
#   tick 2: A decodes its 3rd token: A done.   tick 3: B decodes its 2nd token: B done.
#   tick 4: idle (nothing waiting).            tick 5: C arrives, prefilled, its only token: done.
PROMPT, OUTPUT, ARRIVAL_STEP = [50, 80, 10], [3, 2, 1], [0, 0, 5]
CONFIG = EngineConfig(max_resident=2, decode_slots=1, prefill_token_budget=100, wait_cap=0,
                      chunked_prefill=True, decodes_in_budget=True)
STEPS = {"admit_step": [0, 0, 5], "first_token_step": [0, 1, 5], "finish_step": [2, 3, 5]}
# the seconds clock counts executed steps: the idle tick 4 is not one, so C runs in the 5th step (4)
SECONDS_STEPS = {"admit_step": [0, 0, 4], "first_token_step": [0, 1, 4], "finish_step": [2, 3, 4]}


def run_example(kernel: str, step_clock: bool):
    wl = trace_from_arrays("example", PROMPT, OUTPUT)
    sim = Simulation(wl, np.asarray(ARRIVAL_STEP, dtype=np.float64), policy=make_policy("fcfs"), predictor=None,
                     profile=UnitProfile(), config=CONFIG, charge_cost=False, step_clock=step_clock)
    return run_simulation(sim, kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_worked_example_on_the_step_clock(kernel):
    result = run_example(kernel, step_clock=True)
    for name, expected in STEPS.items():
        assert getattr(result, name).tolist() == expected, name
    # unit time: a step's tick is the clock at its start, its tokens land at its end
    assert result.admit_s.tolist() == [0.0, 0.0, 5.0]
    assert (result.finish_s - 1).tolist() == STEPS["finish_step"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_seconds_clock_counts_executed_steps(kernel):
    result = run_example(kernel, step_clock=False)
    for name, expected in SECONDS_STEPS.items():
        assert getattr(result, name).tolist() == expected, name


def test_step_clock_refuses_what_would_break_its_ticks():
    wl = trace_from_arrays("example", PROMPT, OUTPUT)
    base = dict(policy=make_policy("fcfs"), predictor=None, config=CONFIG, step_clock=True)
    with pytest.raises(ValueError, match="integer arrival steps"):
        Simulation(wl, np.array([0.0, 0.5, 5.0]), profile=UnitProfile(), charge_cost=False, **base)
    with pytest.raises(ValueError, match="no predictor cost"):
        Simulation(wl, np.array([0.0, 0.0, 5.0]), profile=UnitProfile(), charge_cost=True, **base)
    from simulator.profiles import make_profile
    with pytest.raises(ValueError, match="unit engine profile"):
        Simulation(wl, np.array([0.0, 0.0, 5.0]), profile=make_profile("qwen3-8b-h100"), charge_cost=False, **base)


def serving_trace(path, *, steps=STEPS, arrival_step=ARRIVAL_STEP, clock="steps", step_type=None, **serving):
    """A step-clocked serving trace as leap-serve --clock steps writes one (the worked example's
    requests, the scheduler's caps in the metadata, the given live step columns)."""
    base = trace_from_arrays(path.stem, PROMPT, OUTPUT)
    table = base.table.append_column("arrival_step", pa.array(arrival_step, step_type or pa.int64()))
    for name, values in steps.items():
        table = table.append_column(name, pa.array(values, pa.int64()))
    meta = {"backend": "vllm", "backend_details": {"engine_args": {
        "max_num_seqs": 2, "max_num_batched_tokens": 100, "max_model_len": 256, "enable_chunked_prefill": True}},
        "serving": {"clock": clock, "policy": "fcfs", "predictor": "none", "max_resident": 2, "decode_slots": 1,
                    "wait_cap": 0, "max_num_batched_tokens": 100, "load": 1.3, "capacity_req_per_step": 0.1,
                    "ordered_admission": False, **serving}}
    pq.write_table(table.replace_schema_metadata(trace_metadata(**meta)), path)
    return path


def one_line_error(capsys, main, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize("kernel", KERNELS)
def test_simulate_arrivals_steps_writes_the_live_steps(tmp_path, capsys, kernel):
    path = serving_trace(tmp_path / "run-steps.parquet")
    out = tmp_path / "out"
    assert simulate_main(["--trace", str(path), "--arrivals", "steps", "--preset", "recorded", "--predictor", "none",
                          "--kernel", kernel, "--json", "--out", str(out)]) == 0
    capsys.readouterr()
    got = pq.read_table(out / "requests.parquet")
    for name, expected in STEPS.items():
        assert got.column(name).type == pa.int64()
        assert got.column(name).to_pylist() == expected, name
    config = json.loads((out / "config.json").read_text())
    assert (config["arrivals"], config["engine"], config["charge_cost"]) == ("steps", "unit", False)
    assert config["engine_config_used"]["decode_slots"] == 1   # the live scheduler's slots, not max_num_seqs


def test_every_run_writes_step_columns(tmp_path, capsys):
    out = tmp_path / "out"
    assert simulate_main(["--trace", "sharegpt-lengths", "--requests", "40", "--predictor", "none", "--load", "1.2x",
                          "--json", "--out", str(out)]) == 0
    capsys.readouterr()
    got = pq.read_table(out / "requests.parquet")
    admit, first, finish = (np.asarray(got.column(c).to_pylist()) for c in ("admit_step", "first_token_step",
                                                                            "finish_step"))
    assert (0 <= admit).all() and (admit <= first).all() and (first <= finish).all()
    out_tok = np.asarray(got.column("output_tokens").to_pylist())
    assert (finish - first + 1 >= out_tok).all()   # one token per step at most after the first


def test_leap_validate_reports_finish_step_equality_and_lists_mismatches(tmp_path, capsys):
    good = load_trace(serving_trace(tmp_path / "good-steps.parquet"))
    row = validate_step_run(good)
    assert (row["clock"], row["finish_step_match_share"], row["finish_step_mismatches"]) == ("steps", 1.0, [])
    assert row["meets_target"] and row["first_divergence_step"] is None
    planted = {**STEPS, "finish_step": [2, 4, 5]}   # one request off by one step
    bad = load_trace(serving_trace(tmp_path / "bad-steps.parquet", steps=planted))
    comparison = compare_steps(bad, replay_steps(bad))
    assert comparison["finish_step_match_share"] == pytest.approx(2 / 3)
    assert comparison["finish_step_mismatches"] == [{"request_id": "r1", "live_finish_step": 4, "sim_finish_step": 3,
                                                     "live_admit_step": 0, "sim_admit_step": 0}]
    assert comparison["first_divergence_step"] == 3
    assert validate_main([str(tmp_path / "bad-steps.parquet"), "--json"]) == 0
    [printed] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert printed["clock"] == "steps" and not printed["meets_target"]
    assert printed["finish_step_mismatches"][0]["request_id"] == "r1"


def test_step_clock_bad_input_is_one_line(tmp_path, capsys):
    ok = str(serving_trace(tmp_path / "ok-steps.parquet"))
    base = ["--arrivals", "steps", "--preset", "recorded", "--predictor", "none"]
    one_line_error(capsys, simulate_main, ["--trace", ok, *base, "--engine", "qwen3-8b-h100"], "every step lasts 1.0")
    one_line_error(capsys, simulate_main, ["--trace", ok, *base, "--predictor-cost", "charged"], "no predictor cost")
    one_line_error(capsys, simulate_main, ["--trace", ok, *base, "--load", "1.3x"], "--load does not apply")
    negative = str(serving_trace(tmp_path / "neg-steps.parquet", arrival_step=[0, -1, 5]))
    one_line_error(capsys, simulate_main, ["--trace", negative, *base], "column arrival_step: row 1: step -1 is negative")
    floats = str(serving_trace(tmp_path / "float-steps.parquet", arrival_step=[0.0, 0.5, 5.0], step_type=pa.float64()))
    one_line_error(capsys, simulate_main, ["--trace", floats, *base], "column arrival_step: expected integer steps")
    seconds = str(serving_trace(tmp_path / "sec.parquet", clock="seconds"))
    one_line_error(capsys, simulate_main, ["--trace", seconds, *base], "is a seconds-clocked serving run")
    plain = tmp_path / "plain.parquet"
    t = trace_from_arrays("plain", PROMPT, OUTPUT)
    pq.write_table(t.table.replace_schema_metadata(trace_metadata()), plain)
    one_line_error(capsys, simulate_main, ["--trace", str(plain), "--arrivals", "steps", "--predictor", "none"],
                   "has no arrival_step column")
    assert not any(p.name.startswith("out") for p in tmp_path.iterdir())   # nothing written
