"""Calibration files (``leap-serve calibrate``) and the profile fitted on them: the pair is checked
by hash, the relative-error fit recovers a planted step model, a check's speed is a plain ratio of
matching steps, ``simulate --engine fitted:CAL`` uses the same profile, and bad input is one line.
Synthetic calibrations: no engine needed (the recorded one is under traces/live/calibration/)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from core.calibration_files import calibration_paths, is_calibration_path, speed_vs_calibration, write_calibration
from simulator.profiles import make_profile
from simulator.profiles.calibration import load_calibration

PLANTED = {"intercept": 0.025, "prefill_tokens": 0.0011, "decode_requests": 0.004, "decode_context": 2e-6,
           "prefill_sq": 1e-7}


def synthetic_steps(rng=None, scale: float = 1.0) -> pa.Table:
    """A grid of step shapes timed by the planted model (times ``scale``, optional 2% noise)."""
    rows = []
    for b in (1, 2, 4, 8, 16, 32, 64):
        for k in range(12):
            ctx = b * (32 + 8 * k)
            rows.append((f"decode-b{b}-p32", k, 0, 0, b, ctx))
    for q in (48, 320, 1024):
        rows.append((f"prefill-p{q}", 0, q, q * q, 0, 0))
        rows.append((f"mixed-q{q}", 0, q, q * q, 16, 16 * 64))
    cell, step, pre, sq, dec, ctx = (np.array(c) for c in zip(*rows))
    t = (PLANTED["intercept"] + PLANTED["prefill_tokens"] * pre + PLANTED["decode_requests"] * dec
         + PLANTED["decode_context"] * ctx + PLANTED["prefill_sq"] * sq) * scale
    if rng is not None:
        t = t * rng.lognormal(0.0, 0.02, size=len(t))
    return pa.table({"step_s": t, "prefill_tokens": pre, "decode_requests": dec, "decode_context": ctx,
                     "prefill_sq": sq, "host_gap_s": np.full(len(t), 0.001), "cell": cell.astype(str),
                     "cell_step": step})


def write(tmp_path, name="cal", table=None, **meta):
    steps, meta_path = calibration_paths(tmp_path / name)
    write_calibration(steps, meta_path, synthetic_steps() if table is None else table,
                      {"kind": "calibration", "date": "2026-01-01T00:00:00", **meta})
    return meta_path


def test_paths_from_base_or_either_file(tmp_path):
    base = tmp_path / "x"
    want = (tmp_path / "x.calibration.parquet", tmp_path / "x.calibration.json")
    assert calibration_paths(base) == want
    assert calibration_paths(want[0]) == want == calibration_paths(want[1])
    assert is_calibration_path(want[1]) and not is_calibration_path(tmp_path / "x.parquet")


def test_relative_fit_recovers_the_planted_model(tmp_path):
    cal = load_calibration(write(tmp_path))
    got = cal.profile().coefficients
    for name, value in PLANTED.items():
        assert got[name] == pytest.approx(value, rel=1e-6), name
    assert cal.profile().host_gap_s == pytest.approx(0.001)


def test_relative_fit_keeps_short_steps_right_where_the_model_is_off(tmp_path):
    """Long prefills 60% slower than linear (the model cannot follow): the relative fit keeps the
    short decode steps (what a live run is made of) several times closer than plain least squares."""
    from simulator.profiles.fitted import FittedProfile

    table = synthetic_steps()
    y = table.column("step_s").to_numpy() * np.where(table.column("prefill_tokens").to_numpy() >= 1024, 1.6, 1.0)
    table = table.set_column(0, "step_s", pa.array(y))
    cal = load_calibration(write(tmp_path, table=table))
    short = table.column("decode_requests").to_numpy() == 1

    def error(profile):
        cols = [table.column(c).to_numpy() for c in ("prefill_tokens", "prefill_sq", "decode_requests", "decode_context")]
        pred = np.array([profile.step_time(*shape) for shape in zip(*cols)]) - profile.host_gap_s
        return float(np.median(np.abs(pred[short] / y[short] - 1)))

    assert error(cal.profile()) < 0.25 * error(FittedProfile.fit(table))


def test_at_speed_scales_the_fitted_step_times(tmp_path):
    cal = load_calibration(write(tmp_path))
    slow = cal.at_speed(1.1).profile()
    base = cal.profile()
    for shape in ((0, 0, 16, 2000), (320, 320 ** 2, 4, 300)):
        assert slow.step_time(*shape) - slow.host_gap_s == pytest.approx(1.1 * (base.step_time(*shape) - base.host_gap_s))


def test_simulate_engine_fitted_calibration_is_the_same_profile(tmp_path):
    path = write(tmp_path)
    assert make_profile(f"fitted:{path}").coefficients == load_calibration(path).profile().coefficients


def test_speed_is_the_median_ratio_of_matching_steps():
    ref = synthetic_steps()
    fast = synthetic_steps(scale=0.9)
    got = speed_vs_calibration(fast, ref)
    assert got["median"] == pytest.approx(0.9) and got["matched_steps"] == ref.num_rows
    other = fast.set_column(fast.column_names.index("cell"), "cell", pa.array(["nowhere"] * fast.num_rows))
    with pytest.raises(ValueError, match="shares no step"):
        speed_vs_calibration(other, ref)


def test_a_modified_steps_file_is_refused(tmp_path):
    path = write(tmp_path)
    steps, _ = calibration_paths(path)
    write_calibration(steps, tmp_path / "ignored.json", synthetic_steps(scale=2.0), {"kind": "calibration"})
    with pytest.raises(ValueError, match="content hash differs"):
        load_calibration(path)


@pytest.mark.parametrize("meta,message", [({"kind": "trace"}, "not a calibration"), (None, "not found")])
def test_not_a_calibration(tmp_path, meta, message):
    path = tmp_path / "x.calibration.json"
    if meta is not None:
        calibration_paths(path)[0].write_bytes(b"")
        path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=message):
        load_calibration(path)


@pytest.mark.parametrize("cmd,message", [
    (["experiments.cli", "--trace", "sharegpt-lengths", "--requests", "20", "--engine",
      "fitted:{tmp}/none.calibration.json"], "calibration metadata not found"),
    (["live.calibrate", "--out", "{tmp}/o", "--check", "{tmp}/none"], "--check"),
    (["live.calibrate", "--out", "{tmp}/o", "--run", "r1"], "--run names the serving run of a --check"),
])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, cmd, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in cmd]
    proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())


def test_leap_validate_with_the_committed_calibration(capsys):
    """The committed runs against the committed calibration: every row says why it is excluded
    (no check was recorded beside it), single runs get no interval, the table lists the group."""
    from core.trace import traces_dir
    from experiments.validate import main

    live = traces_dir() / "live"
    cal = sorted((live / "calibration").glob("*.calibration.json"))
    runs = [live / "alpaca200-fcfs-1.3.parquet", live / "alpaca200-oracle-1.3.parquet"]
    if not cal or not all(r.exists() for r in runs):
        pytest.skip("no committed calibration or alpaca200 runs")
    kinds = [json.loads(c.read_text())["kind"] for c in cal]
    args = [str(r) for r in runs] + ["--profile-from", str(cal[kinds.index("calibration")])]
    assert main([*args, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [r["run"] for r in rows] == ["alpaca200-fcfs-1.3", "alpaca200-oracle-1.3"]
    for r in rows:
        assert r["excluded"] == "no host-speed check recorded for this run"
        assert r["speed_vs_calibration"] is None and r["real_gain_vs_fcfs_ci95"] is None
        assert r["step_time_ratio"] > 0
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Wall-clock gains over repeats" in out and "alpaca200-fcfs-1.3: no host-speed check" in out
