"""`simulate --replicas N --router NAME` end to end: the hand-checked example of docs/semantics.md
"Fleets", a fleet of 4 on the bundled sharegpt trace, its rerun from config.json, and the bad
inputs (one line naming the flag, exit 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from experiments.cli import main

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "eight-requests.csv"
HAND = ["--trace", str(EXAMPLE), "--engine", "unit", "--arrivals", "recorded", "--decode-slots", "1",
        "--wait-cap", "0", "--quiet", "--jobs", "1", "--replicas", "2"]
# worked out in docs/semantics.md "Fleets" (output tokens 5 3 8 1 4 2 7 6, all at t = 0)
ROUND_ROBIN_FCFS = {"replica": [0, 1, 0, 1, 0, 1, 0, 1], "finish_s": [5, 3, 12, 1, 15, 4, 21, 9]}
WORK_COUNTDOWN = {"replica": [0, 1, 1, 0, 0, 0, 1, 0], "finish_s": [9, 3, 16, 1, 5, 2, 9, 14]}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _requests(folder: Path) -> dict:
    table = pq.read_table(folder / "requests.parquet")
    return {"replica": table.column("replica").to_pylist(), "finish_s": table.column("finish_s").to_pylist()}


@pytest.mark.parametrize(("flags", "expected"), [
    (["--router", "round-robin", "--predictor", "none"], ROUND_ROBIN_FCFS),
    (["--router", "least-requests", "--predictor", "none"], ROUND_ROBIN_FCFS),   # alternates on ties
    (["--router", "oracle-work", "--predictor", "oracle", "--policy", "countdown"], WORK_COUNTDOWN),
    (["--router", "least-work", "--predictor", "oracle", "--policy", "countdown"], WORK_COUNTDOWN),
])
def test_two_replicas_route_and_finish_as_worked_out_by_hand(tmp_path, flags, expected):
    assert main([*HAND, *flags, "--out", str(tmp_path)]) == 0
    assert _requests(tmp_path) == expected
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mean_e2e_s"] == sum(expected["finish_s"]) / 8 and summary["replicas"] == 2


def test_a_fleet_of_four_on_sharegpt_and_its_rerun_from_config(tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["--trace", "sharegpt", "--requests", "300", "--load", "1.3x", "--replicas", "4",
             "--router", "least-work", "--predictor", "leap-rls", "--policy", "countdown", "--quiet", "--json"]
    assert main([*flags, "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    requests = _requests(out)
    assert sorted(set(requests["replica"])) == [0, 1, 2, 3] and len(requests["replica"]) == 300
    assert summary["replicas"] == 4 and summary["completed"] == 300
    assert 1.0 <= summary["replica_work_max_over_mean"] <= 4.0
    config = json.loads((out / "config.json").read_text())
    assert (config["replicas"], config["router"]) == (4, "least-work")
    again = tmp_path / "again"
    assert main(["--config", str(out / "config.json"), "--out", str(again), "--quiet"]) == 0
    assert (again / "requests.parquet").read_bytes() == (out / "requests.parquet").read_bytes()


def test_one_replica_writes_the_single_engines_files(tmp_path):
    """The default (--replicas 1) keeps today's files: no replica column, no fleet keys."""
    assert main([*HAND[:-2], "--predictor", "none", "--out", str(tmp_path)]) == 0
    assert "replica" not in pq.read_table(tmp_path / "requests.parquet").column_names
    assert "replicas" not in json.loads((tmp_path / "config.json").read_text())


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--replicas", "0"], "argument --replicas: must be >= 1"),
    (["--replicas", "-1"], "argument --replicas: must be >= 1"),
    (["--replicas", str(10**9)], "argument --replicas: must be <= 4,096"),
    (["--replicas", "2", "--router", "nope"], "unknown --router 'nope'"),
    (["--replicas", "2", "--router", "least-work", "--predictor", "none"], "--router least-work reads predicted work"),
    (["--replicas", "2", "--arrivals", "closed:2"], "--replicas: a closed loop"),
])
def test_bad_fleet_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, flags, fragment):
    out = tmp_path / "out"
    base = ["--trace", str(EXAMPLE), "--engine", "unit", "--quiet"]
    base += [] if "--arrivals" in flags else ["--arrivals", "recorded"]
    assert main([*base, *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("simulate: error: ") and fragment in err, err
    assert not out.exists()


def test_least_work_refuses_a_rank_predictor_by_name(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--trace", "sharegpt", "--replicas", "2", "--router", "least-work", "--predictor", "ltr",
                 "--policy", "countdown", "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--predictor ltr cannot serve it" in err, err
    assert not out.exists()


def test_routers_compared_in_one_command(tmp_path, capsys):
    """``--router all`` beside two predictors: every router behind each, least-work left out for the
    run without a predictor (it cannot serve it); one table with a router column; results and each
    summary carry router and replicas; each run is the single-router run's bytes."""
    out = tmp_path / "all"
    assert main([*HAND, "--router", "all", "--predictor", "none,oracle", "--policy", "countdown",
                 "--out", str(out)]) == 0
    results = pq.read_table(out / "results.parquet").to_pylist()
    pairs = sorted((r["predictor"], r["router"]) for r in results)
    # without --kv-blocks, 'all' also leaves out the routers reading KV blocks or prefix caches
    cacheless = ("prefix-affinity", "queue-depth", "vllm-dp")
    assert pairs == sorted([("none", r) for r in ("round-robin", "least-requests", "power-of-two", "oracle-work",
                                                  *cacheless)]
                           + [("oracle", r) for r in ("round-robin", "least-requests", "power-of-two", "least-work",
                                                      "oracle-work", *cacheless)])
    assert {r["replicas"] for r in results} == {2}
    header = (out / "results.csv").read_text().splitlines()[0].replace('"', "")
    assert header.startswith("trace,predictor,policy,router,replicas,")
    printed = capsys.readouterr().out
    assert "2 replicas" in printed and " router " in printed and printed.count("oracle-work") == 2
    folder = out / "oracle-countdown-least-work-x2-recorded-seed0"
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["router"], summary["replicas"]) == ("least-work", 2)
    assert _requests(folder) == WORK_COUNTDOWN
    one = tmp_path / "one"
    assert main([*HAND, "--router", "least-work", "--predictor", "oracle", "--policy", "countdown",
                 "--out", str(one)]) == 0
    assert (one / "requests.parquet").read_bytes() == (folder / "requests.parquet").read_bytes()


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--router", "round-robin,nope"], "unknown --router 'nope'"),
    (["--router", ","], "--router: empty list"),
    (["--router", "all,least-work", "--predictor", "none"], "--router least-work reads predicted work"),
])
def test_bad_router_lists_are_one_line_exit_2(tmp_path, capsys, flags, fragment):
    out = tmp_path / "out"
    assert main([*HAND, *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err
    assert not out.exists()
