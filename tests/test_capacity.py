"""Capacity = the engine's steady-state saturated throughput on the workload's mix, whatever the
trace size; a run that never gives its policy a choice says so; a bad capacity cache is named and
recomputed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from core.trace import load_trace, trace_from_arrays
from experiments.cli import main
from simulator.capacity import capacity_key, measure_capacity
from simulator.engine import EngineConfig
from simulator.profiles import make_profile
from simulator.profiles.unit import UnitProfile

TRACE = "sharegpt-lengths"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("n", [80, 400])
def test_capacity_does_not_depend_on_trace_size(n):
    # the old "all at t=0, n / makespan" gave 6.88 req/s for these 80 requests and 12.77 tiled 4x:
    # set by the longest request's drain, not by the engine
    trace = load_trace(TRACE)
    small = trace.take(np.arange(n))
    tiled = small.take(np.tile(np.arange(n), 4))
    profile = make_profile("qwen3-8b-h100", trace)
    once, four = measure_capacity(small, profile, EngineConfig()), measure_capacity(tiled, profile, EngineConfig())
    assert four == pytest.approx(once, rel=0.03)


def test_warning_when_the_policy_never_chooses(capsys):
    assert main(["--trace", TRACE, "--requests", "80", "--load", "1.5x", "--predictor", "none,oracle", "--json"]) == 0
    captured = capsys.readouterr()
    runs = [json.loads(x) for x in captured.out.splitlines()]
    assert [r["saturated_share"] for r in runs] == [0.0, 0.0]
    assert captured.err.count("\n") == 1
    assert "warning: 1 of 2 run(s) (load 1.5x) never had more ready requests than the 64 decode slots" in captured.err


def test_no_warning_when_the_engine_saturates(capsys):
    assert main(["--trace", TRACE, "--requests", "800", "--load", "1.5x", "--predictor", "none,oracle", "--json"]) == 0
    captured = capsys.readouterr()
    runs = [json.loads(x) for x in captured.out.splitlines()]
    assert all(r["saturated_share"] > 0.5 for r in runs)
    assert "warning" not in captured.err


@pytest.mark.parametrize("content", ["0", "[]", '"text"', "not json", "{bad", "null"])
def test_corrupt_capacity_cache_is_named_and_recomputed(tmp_path, capsys, content):
    trace = trace_from_arrays("c", [1] * 6, [4] * 6)
    config = EngineConfig(decode_slots=2)
    path = tmp_path / "cache" / "capacity.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert measure_capacity(trace, UnitProfile(), config) == pytest.approx(2 / 3)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"capacity cache {path}" in err
    assert isinstance(json.loads(path.read_text()), dict)   # rewritten whole
    assert measure_capacity(trace, UnitProfile(), config) == pytest.approx(2 / 3)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("entry", [0, -1.0, [], "8.5", {"capacity_req_s": 0}, {"capacity_req_s": "8"},
                                   {"capacity_req_s": None}, {"capacity_req_s": True}, {}])
def test_invalid_capacity_cache_entry_is_named_and_recomputed(tmp_path, capsys, entry):
    from dataclasses import asdict

    trace = trace_from_arrays("c", [1] * 6, [4] * 6)
    config = EngineConfig(decode_slots=2)
    key = capacity_key(trace, UnitProfile().describe(), asdict(config))
    path = tmp_path / "cache" / "capacity.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({key: entry, "other": {"capacity_req_s": 1.0}}))
    assert measure_capacity(trace, UnitProfile(), config) == pytest.approx(2 / 3)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and key in err
    table = json.loads(path.read_text())
    assert table[key]["capacity_req_s"] == pytest.approx(2 / 3) and table["other"] == {"capacity_req_s": 1.0}


def test_a_tiled_run_gets_its_traces_capacity_measured_once(monkeypatch):
    """`--tile N` (whole copies, the same mix) runs at the trace's own capacity at every size, so a
    scaling study pays for one capacity measurement; a cut below the trace's size measures its own."""
    import simulator.runner as runner
    from simulator.runner import RunConfig, prepare

    measured = []
    monkeypatch.setattr(runner, "measure_capacity",
                        lambda workload, *a, **k: measured.append(len(workload)) or measure_capacity(workload, *a, **k))
    base = prepare(RunConfig(trace=TRACE, requests=None, load=1.0)).capacity_req_s
    n = len(load_trace(TRACE))
    tiled = [prepare(RunConfig(trace=TRACE, tile=size, load=1.0)).capacity_req_s for size in (n, 2 * n + 7)]
    assert tiled == [base, base]
    assert measured == [n, n, n]
    cut = prepare(RunConfig(trace=TRACE, tile=n // 2, load=1.0)).capacity_req_s
    assert measured[-1] == n // 2 and cut != base


def test_live_capacity_cache_is_the_same_cache(tmp_path, monkeypatch, capsys):
    """leap-serve's live capacities go through core.capacity_cache too: a bad entry is named on
    stderr and ignored, a write keeps the other entries, a good entry reads back."""
    from live.serve_capacity import CAPACITY_FILE, read_capacity, write_capacity

    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path))
    path = tmp_path / CAPACITY_FILE
    path.write_text(json.dumps({"k": {"capacity_req_s": "fast"}, "other": {"capacity_req_s": 0.5}}))
    assert read_capacity("k") is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "entry k is invalid" in err
    write_capacity("k", {"capacity_req_s": 0.25, "window_s": 10.0})
    assert read_capacity("k") == {"capacity_req_s": 0.25, "window_s": 10.0}
    assert read_capacity("other") == {"capacity_req_s": 0.5}
    with pytest.raises(ValueError, match="finite positive"):
        write_capacity("k", {"capacity_req_s": float("nan")})
