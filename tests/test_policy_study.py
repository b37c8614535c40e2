"""experiments.policy_study: simulate --json lines to a table with intervals over seeds (paired
changes against FCFS), and its one-line refusals."""

from __future__ import annotations

import json

import pytest

from experiments.fleet_study import interval
from experiments.policy_study import main, markdown, read_runs, rows


def summary(policy, seed, nl, p99, predictor="leap-rls"):
    return {"trace": "t", "load": 1.5, "predictor": predictor, "policy": policy, "seed": seed, "mean_ptl_s": nl,
            "p99_e2e_s": p99, "p99_tpot_ms": 100.0, "mean_ttft_s": 0.1, "p99_ttft_ms": 900.0,
            "slo_attainment": 0.5, "request_goodput": 2.0}


def test_rows_pair_each_seed_with_fcfs_of_the_same_predictor(tmp_path):
    runs = [summary("fcfs", 0, 0.2, 70.0), summary("fcfs", 1, 0.1, 60.0),
            summary("countdown", 0, 0.1, 140.0), summary("countdown", 1, 0.08, 90.0)]
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in runs) + "\n")
    table = {r["policy"]: r for r in rows(read_runs([path]))}
    assert table["countdown"]["nl_vs_fcfs"] == pytest.approx(interval([-0.5, -0.2]))
    assert table["countdown"]["p99_vs_fcfs"] == pytest.approx(interval([1.0, 0.5]))
    assert table["countdown"]["mean_ptl_s"] == pytest.approx(interval([0.1, 0.08]))
    assert table["fcfs"]["p99_ttft_ms"] == pytest.approx((0.9, 0.0))   # ms -> s
    text = markdown(list(table.values()))
    assert "| t | 1.5x | leap-rls | countdown | 2 | 0.09 ± 0.13 | -35.0% ± 190.6 |" in text


@pytest.mark.parametrize(("content", "message"), [("", "no runs"), ("{oops\n", ":1: not a JSON line"),
                                                  ('{"seed": 0}\n', ":1: not a run summary")])
def test_bad_files_are_one_line_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "runs.jsonl"
    path.write_text(content)
    from core.errors import run_command
    assert run_command(main, [str(path)], "policy_study") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
