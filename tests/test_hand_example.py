"""The hand-checkable example of docs/semantics.md: eight requests queued at t = 0, the unit engine
(every step 1 s), one decode slot, no wait cap. Every finish time below is worked out by hand
there; the run must reproduce them exactly, in about a second."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from experiments.cli import main

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "eight-requests.csv"
FLAGS = ["--trace", str(EXAMPLE), "--engine", "unit", "--arrivals", "recorded", "--decode-slots", "1",
         "--wait-cap", "0", "--predictor", "none,oracle", "--quiet", "--jobs", "1"]
# output tokens 5 3 8 1 4 2 7 6; step 1 prefills all eight and emits each one's first token, so the
# 1-token request ends at t = 1 and the others then decode one at a time
FCFS_FINISH = [5, 7, 14, 1, 17, 18, 24, 29]           # in row order: 1 + 4, +2, +7, -, +3, +1, +6, +5
COUNTDOWN_FINISH = [11, 4, 29, 1, 7, 2, 22, 16]       # shortest remaining first: 1, 2, 3, 4, 5, 6, 7 more


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.mark.parametrize("kernel", ["reference", "compiled"])
def test_eight_requests_finish_when_worked_out_by_hand(tmp_path, capsys, kernel):
    assert main([*FLAGS, "--kernel", kernel, "--out", str(tmp_path), "--wide"]) == 0   # mean e2e is in --wide
    out = capsys.readouterr().out
    finish = {run: pq.read_table(tmp_path / f"{run}-recorded-seed0" / "requests.parquet")
              .column("finish_s").to_pylist() for run in ("none-fcfs", "oracle-countdown")}
    assert finish == {"none-fcfs": FCFS_FINISH, "oracle-countdown": COUNTDOWN_FINISH}
    assert "arrivals recorded" in out and "8 requests" in out
    assert f"{sum(FCFS_FINISH) / 8:.3g}" in out and f"{sum(COUNTDOWN_FINISH) / 8:.3g}" in out   # mean e2e
