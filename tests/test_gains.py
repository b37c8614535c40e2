"""Wall-clock gains over repeats (experiments/gains.py): the bootstrap interval is deterministic and
covers a planted gain, runs off their calibration are excluded (and listed), and the group fields
land on every repeat's row. Synthetic runs: no engine, no trace files."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from core.calibration_files import calibration_paths, write_calibration
from experiments import gains
from experiments.gains import (
    EXCLUDE_SPEED_OFF,
    add_gain_intervals,
    bootstrap_gain_ci,
    calibration_section,
    checked_speed,
    checks_of,
    exclusion,
    gains_section,
    pooled_gain,
    run_speeds,
)
from simulator.profiles.calibration import load_calibration


def _runs(rng, mean: float, repeats: int, n: int = 200) -> list[np.ndarray]:
    """Per-request PTLs of ``repeats`` runs: lognormal around ``mean`` with a per-run host factor."""
    return [mean * rng.uniform(0.97, 1.03) * rng.lognormal(0.0, 0.4, size=n) for _ in range(repeats)]


def test_bootstrap_is_seeded_and_deterministic():
    rng = np.random.default_rng(1)
    policy, fcfs = _runs(rng, 0.8, 3), _runs(rng, 1.0, 3)
    assert bootstrap_gain_ci(policy, fcfs) == bootstrap_gain_ci(policy, fcfs)
    assert bootstrap_gain_ci(policy, fcfs, seed=1) != bootstrap_gain_ci(policy, fcfs, seed=2)


def test_interval_covers_a_planted_gain_and_excludes_zero():
    rng = np.random.default_rng(7)
    policy, fcfs = _runs(rng, 0.8, 3), _runs(rng, 1.0, 3)   # planted: -20%
    low, high = bootstrap_gain_ci(policy, fcfs, samples=1000)
    assert low < -0.20 < high
    assert high < 0.0
    assert low <= pooled_gain(policy, fcfs) <= high


def test_requests_are_resampled_too():
    """Identical repeats: resampling runs alone would give a zero-width interval."""
    rng = np.random.default_rng(4)
    policy, fcfs = _runs(rng, 0.8, 1) * 2, _runs(rng, 1.0, 1) * 2
    low, high = bootstrap_gain_ci(policy, fcfs, samples=500)
    assert high - low > 0.05


def test_interval_widens_with_spread_between_repeats():
    rng = np.random.default_rng(3)
    base = _runs(rng, 1.0, 3)
    steady = [x * 0.8 for x in base]
    shaky = [x * f for x, f in zip(base, (0.6, 0.8, 1.0))]   # same mean gain, repeats disagree
    w_steady = np.diff(bootstrap_gain_ci(steady, base, samples=1000))[0]
    w_shaky = np.diff(bootstrap_gain_ci(shaky, base, samples=1000))[0]
    assert w_shaky > 2 * w_steady


@pytest.mark.parametrize("before,after,excluded", [
    (1.0, 1.0, False), (1.0 + EXCLUDE_SPEED_OFF * 0.9, None, False), (1.0 - EXCLUDE_SPEED_OFF * 1.1, 1.0, True),
    (1.0, 1.0 + EXCLUDE_SPEED_OFF * 1.5, True), (None, None, True)])
def test_exclusion_at_three_percent_either_way(before, after, excluded):
    reason = exclusion(before, after)
    assert (reason is not None) == excluded
    if before is None:
        assert "no host-speed check" in reason


def _write(folder, name: str, kind: str, date: str, **meta):
    table = pa.table({"step_s": [0.1], "prefill_tokens": [0], "decode_requests": [1], "decode_context": [33],
                      "prefill_sq": [0], "host_gap_s": [0.001], "cell": ["decode-b1-p32"], "cell_step": [0]})
    steps, meta_path = calibration_paths(folder / name)
    write_calibration(steps, meta_path, table, {"kind": kind, "date": date, **meta})
    return meta_path


def test_checks_are_found_by_calibration_and_ordered_by_time(tmp_path):
    cal = load_calibration(_write(tmp_path, "set", "calibration", "2026-01-01T00:00:00"))
    ref = {"name": "set"}
    _write(tmp_path, "b.check", "check", "2026-01-01T00:10:00", calibration=ref, run="b",
           speed_vs_calibration={"median": 1.05})
    _write(tmp_path, "a.check", "check", "2026-01-01T00:05:00", calibration=ref, run="a",
           speed_vs_calibration={"median": 0.99})
    _write(tmp_path, "other.check", "check", "2026-01-01T00:07:00", calibration={"name": "another"}, run="x",
           speed_vs_calibration={"median": 1.0})
    checks = checks_of(cal)
    assert [c.metadata["run"] for c in checks] == ["a", "b"]
    assert run_speeds("a", checks) == (0.99, 1.05)     # after-check: the next run's check
    assert run_speeds("b", checks) == (1.05, None)
    assert run_speeds("zzz", checks) == (None, None)


def _trace(name: str, policy: str, predictor: str, load: float = 1.3):
    return SimpleNamespace(name=name, metadata={"serving": {"capacity_key": "w", "load": load, "policy": policy,
                                                            "predictor": predictor}})


def test_group_fields_on_every_repeat_and_excluded_runs_left_out(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    ptl = {}
    names = []
    for r in (1, 2, 3):
        ptl[f"f-r{r}"], ptl[f"o-r{r}"] = _runs(rng, 1.0, 1)[0], _runs(rng, 0.7, 1)[0]
        names += [f"f-r{r}", f"o-r{r}"]
    ptl["o-r3"] = ptl["o-r3"] * 3.0          # a run on a slow host: must not enter the interval
    monkeypatch.setattr(gains, "request_ptl", lambda t: ptl[t.name])
    monkeypatch.setattr(gains, "_sim_gain_at_speed", lambda *a: -0.25)
    replayed = {}

    def replay(t, cal, speed, cost):
        replayed[t.name] = speed
        return {"sim_mean_ptl_s_at_checked_speed": 1.0, "step_time_ratio_at_checked_speed": 1.01,
                "mean_e2e_err_at_checked_speed": -0.02, "p95_e2e_err_at_checked_speed": 0.03}

    monkeypatch.setattr(gains, "replay_at_checked_speed", replay)
    cal = load_calibration(_write(tmp_path, "set", "calibration", "2026-01-01T00:00:00"))
    for i, n in enumerate(names):
        speed = 1.2 if n == "o-r3" else 1.0
        _write(tmp_path, f"{n}.check", "check", f"2026-01-01T00:{10 + i}:00", calibration={"name": "set"}, run=n,
               speed_vs_calibration={"median": speed})
    traces = [_trace(n, "fcfs" if n.startswith("f") else "countdown", "none" if n.startswith("f") else "oracle")
              for n in names]
    rows = [{"run": n} for n in names]
    summaries = add_gain_intervals(rows, traces, cal)
    assert len(summaries) == 1
    s = summaries[0]
    # o-r3's own check is slow; f-r3 ran just before it, so its after-check is that slow one
    assert s["runs"] == ["o-r1", "o-r2"] and s["fcfs_runs"] == ["f-r1", "f-r2"]
    assert sorted(s["excluded"]) == ["f-r3", "o-r3"]
    assert "before the run at 1.200x" in s["excluded"]["o-r3"] and "after the run" in s["excluded"]["f-r3"]
    low, high = s["real_gain_vs_fcfs_ci95"]
    assert low < -0.3 + 0.05 and high > -0.3 - 0.05 and high < 0
    by = {r["run"]: r for r in rows}
    assert by["o-r3"]["excluded"] and by["o-r1"]["excluded"] is None
    assert by["f-r2"]["speed_vs_calibration"] == 1.0
    assert by["o-r1"]["real_gain_vs_fcfs_ci95"] == s["real_gain_vs_fcfs_ci95"] == by["o-r3"]["real_gain_vs_fcfs_ci95"]
    assert by["o-r1"]["sim_gain_vs_fcfs_calibrated"] == -0.25
    table = gains_section(summaries)
    assert "o-r3" in table and "[" in table and "f-r1 (1.000x)" in table
    # every checked run is replayed at the speed its checks bracket: f-r3 between 1.0 and 1.2
    assert replayed["f-r3"] == pytest.approx(np.sqrt(1.2)) and replayed["o-r3"] == 1.2   # o-r3: last, no after
    assert by["f-r3"]["checked_speed"] == pytest.approx(np.sqrt(1.2))
    per_run = calibration_section(rows)
    assert per_run.count("\n| ") == 1 + len(names) and "| o-r3 | 1.200 | - | 1.200 | 1.010 | -2.0% | +3.0% | yes |" in per_run


def test_checked_speed_is_the_geometric_mean_of_the_bracketing_checks():
    assert checked_speed(1.0, 1.21) == pytest.approx(1.1)
    assert checked_speed(0.9, None) == 0.9
    assert checked_speed(None, 1.0) is None


def test_simulated_gain_pools_the_replays_at_checked_speed():
    rows = {"a": {"sim_mean_ptl_s_at_checked_speed": 0.5, "requests": 100},
            "b": {"sim_mean_ptl_s_at_checked_speed": 1.0, "requests": 300},
            "f": {"sim_mean_ptl_s_at_checked_speed": 1.0, "requests": 200}}
    runs = [SimpleNamespace(name="a"), SimpleNamespace(name="b")]
    assert gains._sim_gain_at_speed(runs, [SimpleNamespace(name="f")], rows) == pytest.approx(0.875 - 1.0)
    assert gains._sim_gain_at_speed(runs, [SimpleNamespace(name="missing")], rows) is None


def test_single_runs_get_no_interval(monkeypatch):
    rng = np.random.default_rng(2)
    ptl = {"f": _runs(rng, 1.0, 1)[0], "l": _runs(rng, 0.9, 1)[0]}
    monkeypatch.setattr(gains, "request_ptl", lambda t: ptl[t.name])
    rows = [{"run": "f"}, {"run": "l"}]
    (s,) = add_gain_intervals(rows, [_trace("f", "fcfs", "none"), _trace("l", "countdown", "leap")])
    assert s["real_gain_vs_fcfs_ci95"] is None and s["real_gain_vs_fcfs_pooled"] is not None
    assert rows[1]["excluded"] is None and rows[1]["speed_vs_calibration"] is None


@pytest.mark.parametrize("tolerance,excluded", [(0.05, True), (0.25, False)])
def test_speed_tolerance_moves_the_exclusion_limit(tolerance, excluded):
    reason = exclusion(1.12, 1.0, tolerance)
    assert (reason is not None) == excluded
    if excluded:
        assert f"limit {tolerance:.0%}" in reason


def test_speed_tolerance_out_of_range_is_one_line_exit_2(capsys):
    from experiments.validate import main

    assert main(["--speed-tolerance", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--speed-tolerance 3" in err[0]


def _checked_set(tmp_path, speeds: dict[str, float]):
    cal = load_calibration(_write(tmp_path, "set", "calibration", "2026-01-01T00:00:00"))
    for i, (n, speed) in enumerate(speeds.items()):
        _write(tmp_path, f"{n}.check", "check", f"2026-01-01T00:{10 + i}:00", calibration={"name": "set"}, run=n,
               speed_vs_calibration={"median": speed})
    return cal


def test_a_host_that_drifted_since_the_calibration_keeps_the_runs_that_share_its_speed(tmp_path, monkeypatch):
    """Every check 9% faster than the calibration, one run's 7% off the others: against the set's
    median only that run (and the one before it, whose after-check it is) is excluded; against
    the calibration every run is."""
    speeds = {"f-r1": 0.91, "o-r1": 0.91, "f-r2": 0.92, "o-r2": 0.975, "f-r3": 0.91, "o-r3": 0.905}
    cal = _checked_set(tmp_path, speeds)
    monkeypatch.setattr(gains, "request_ptl", lambda t: np.full(10, 0.7 if t.name.startswith("o") else 1.0))
    monkeypatch.setattr(gains, "replay_at_checked_speed", lambda *a: {"sim_mean_ptl_s_at_checked_speed": None})
    traces = [_trace(n, "fcfs" if n.startswith("f") else "countdown", "none" if n.startswith("f") else "oracle")
              for n in speeds]
    rows = [{"run": n} for n in speeds]
    (s,) = add_gain_intervals(rows, traces, cal)
    assert sorted(s["excluded"]) == ["f-r2", "o-r2"] and "off the set's median 0.9" in s["excluded"]["o-r2"]
    assert s["runs"] == ["o-r1", "o-r3"] and s["real_gain_vs_fcfs_ci95"] is not None
    assert rows[0]["speed_reference"] == pytest.approx(np.median([np.sqrt(a * b) for a, b in zip(
        list(speeds.values()), list(speeds.values())[1:])] + [0.905]))
    rows = [{"run": n} for n in speeds]
    (s,) = add_gain_intervals(rows, traces, cal, reference="calibration")
    assert sorted(s["excluded"]) == sorted(speeds) and s["real_gain_vs_fcfs_pooled"] is None
    assert "off the calibration" in s["excluded"]["o-r1"]
    with pytest.raises(ValueError, match="--speed-reference"):
        add_gain_intervals(rows, traces, cal, reference="median")
