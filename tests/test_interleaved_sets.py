"""CI's hold on the committed wall-clock sets (issue 20, docs/results.md "Wall-clock gains with
intervals"): `leap-validate --profile-from CALIBRATION` on each interleaved set under
traces/live/interleaved/ must give back the figures the results page prints: the pooled gains and
their bootstrap 95% intervals (seeded, so exact to the printed 0.1%), the exclusions at 3%, and
every run beside its checked speed. A change to the gain, interval, check or exclusion code that
moves a published figure fails here on real runs."""

from __future__ import annotations

import json

import pytest

from core.trace import traces_dir
from experiments.serving_runs import SIDE_TABLE_SUFFIXES
from experiments.validate import main as validate_main

LIVE = traces_dir() / "live"

#: set -> (runs glob, calibration, {predictor: (pooled gain, [low, high])} at --speed-tolerance 0.2)
SETS = {
    "lmsys100-1.3": ("interleaved/lmsys100-*.parquet", "calibration/lmsys100-1.3.calibration.json",
                     {"leap": (-0.176, [-0.288, -0.041]), "leap-rls": (-0.182, [-0.266, -0.092]),
                      "oracle": (-0.243, [-0.349, -0.112])}),
    "alpaca100-1.3-set2": ("interleaved/alpaca100-*.parquet", "calibration/alpaca100-1.3-set2.calibration.json",
                           {"leap": (-0.194, [-0.358, -0.012]), "leap-rls": (-0.039, [-0.247, 0.199]),
                            "oracle": (-0.198, [-0.364, -0.008])}),
}


def _rows(capsys, runs: str, calibration: str, *extra: str) -> list[dict]:
    paths = sorted(str(p) for p in LIVE.glob(runs) if not p.name.endswith(SIDE_TABLE_SUFFIXES))
    assert len(paths) == 12, f"{runs}: expected 12 runs (F L R O x 3), found {len(paths)}"
    assert validate_main([*paths, "--profile-from", str(LIVE / calibration), "--json", *extra]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("name", SETS)
def test_published_intervals_come_back(name, capsys):
    runs, calibration, published = SETS[name]
    rows = _rows(capsys, runs, calibration, "--speed-tolerance", "0.2")
    assert all(r["excluded"] is None and r["checked_speed"] is not None for r in rows)
    for predictor, (gain, interval) in published.items():
        row = next(r for r in rows if r["predictor"] == predictor)
        assert round(row["real_gain_vs_fcfs_pooled"], 3) == gain
        assert [round(x, 3) for x in row["real_gain_vs_fcfs_ci95"]] == interval
        assert len(row["repeats_used"]) == len(row["fcfs_repeats_used"]) == 3
        assert row["sim_gain_vs_fcfs_calibrated"] is not None


@pytest.mark.parametrize("name", SETS)
def test_every_run_is_excluded_at_three_percent(name, capsys):
    runs, calibration, _ = SETS[name]
    rows = _rows(capsys, runs, calibration)
    assert all(r["excluded"] and "limit 3%" in r["excluded"] for r in rows)
    assert all(r["real_gain_vs_fcfs_ci95"] is None for r in rows)
