"""experiments/fleet_study.py: recorded arrivals replayed from a seeded offset, KV blocks per replica
(preemptions counted per run), the --json rewritten after each run and resumed without duplicates,
and bad input refused in one line (exit 2) before anything is written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments import fleet_study
from simulator.config import EngineConfig
from simulator.runner import RunConfig, execute, prepare

TINY = ["--trace", "sharegpt", "--replicas", "2", "--per-replica", "6", "--seeds", "2"]


@pytest.fixture(autouse=True)
def _cheap(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    # the two arms without a predictor: the study's loop, tables and files at a fraction of the cost
    monkeypatch.setattr(fleet_study, "ARMS", fleet_study.ARMS[:2])


@pytest.fixture
def azure_like(tmp_path):
    path = tmp_path / "stamps.csv"
    times = np.cumsum(np.random.default_rng(7).exponential(1.0, 60))
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:{int(t) // 60:02d}:{t % 60:09.6f},10,5\n" for t in times))
    return path


def test_arrival_window_is_a_seeded_slice_starting_at_zero():
    times = np.arange(100, dtype=np.float64) ** 1.5
    windows = [fleet_study.arrival_window(times, 10, seed) for seed in range(5)]
    assert all(len(w) == 10 and w[0] == 0.0 for w in windows)
    assert len({tuple(w) for w in windows}) > 1   # seeds replay different windows
    np.testing.assert_array_equal(windows[3], fleet_study.arrival_window(times, 10, 3))   # same seed, same window
    for w in windows:   # each window is consecutive gaps of the trace
        gaps = np.diff(w)
        k = int(np.flatnonzero(np.isclose(np.diff(times), gaps[0]))[0])
        np.testing.assert_allclose(gaps, np.diff(times)[k:k + 9])
    assert fleet_study.arrival_window(times, 500, 1) is times   # too short: all of it (the engine tiles)


def test_recorded_arrivals_with_kv_blocks_resume_without_duplicates(tmp_path, azure_like, capsys):
    out = tmp_path / "runs.json"
    argv = [*TINY, "--arrivals", str(azure_like), "--kv-blocks", "420", "--json", str(out)]
    assert fleet_study.cli(argv) == 0
    first = capsys.readouterr()
    saved = json.loads(out.read_text())
    assert len(saved["runs"]) == 4 and first.err.count("fleet_study: 2 ") == 4
    assert saved["settings"]["kv_blocks"] == 420 and saved["settings"]["arrivals"].startswith("stamps.csv sha256:")
    assert all("preemptions" in r for r in saved["runs"]) and "preemptions / run" in first.out
    assert "stamps.csv" in first.out and "420 KV blocks per replica" in first.out
    # a run lost (the study stopped before writing it): the rerun does that one only
    saved["runs"] = saved["runs"][:-1]
    out.write_text(json.dumps(saved))
    assert fleet_study.cli(argv) == 0
    again = capsys.readouterr()
    assert again.err.count("fleet_study: 2 ") == 1
    rerun = json.loads(out.read_text())["runs"]
    keys = [(r["replicas"], r["arm"], r["seed"]) for r in rerun]
    assert len(keys) == len(set(keys)) == 4
    assert again.out == first.out   # same seed, same figures: the resumed table is the first one


def test_a_fleet_reports_its_preemptions(tmp_path):
    config = RunConfig(trace="sharegpt", load=1.3, replicas=2, router="round-robin", kernel="reference", tile=40,
                       engine_config=EngineConfig(kv_blocks=420))
    prepared = prepare(config)
    summary, result = execute(prepared)
    assert result.preemptions is not None and summary["preemptions"] == int(result.preemptions.sum()) > 0
    fleet = prepared.simulation.fleet   # type: ignore[attr-defined]
    assert int(result.preemptions.sum()) == sum(int(r.parts.table.preemptions.sum()) for r in fleet)


@pytest.mark.parametrize(("flags", "named"), [
    (["--replicas", "0"], "--replicas"),
    (["--replicas", "4,x"], "--replicas"),
    (["--kv-blocks", "0"], "--kv-blocks"),
    (["--kv-blocks", "20"], "--kv-blocks 20"),   # smaller than the trace's longest prompt
    (["--arrivals", "missing.csv"], "--arrivals"),
    (["--per-replica", "0"], "--per-replica"),
    (["--prefix-caching", "on"], "--prefix-caching on"),   # without --kv-blocks
    (["--kv-blocks", "2000", "--prefix-caching", "maybe"], "--prefix-caching"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, flags, named, capsys):
    out = tmp_path / "runs.json"
    assert fleet_study.cli([*TINY, *flags, "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_json_of_other_settings_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "runs.json"
    held = {"settings": {"trace": "sharegpt", "load": 2.0}, "runs": []}
    out.write_text(json.dumps(held))
    assert fleet_study.cli([*TINY, "--json", str(out)]) == 2
    assert "--json" in capsys.readouterr().err and json.loads(out.read_text()) == held
    out.write_text("not json")
    assert fleet_study.cli([*TINY, "--json", str(out)]) == 2
    assert "not a fleet_study results file" in capsys.readouterr().err and out.read_text() == "not json"
