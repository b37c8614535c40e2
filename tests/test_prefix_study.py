"""experiments.prefix_study: its flags refused in one line before any run, and one real run of the
multi-turn set whose orders differ under a bound cache."""

from __future__ import annotations

import json

import pytest

from experiments import prefix_study


@pytest.mark.parametrize(("argv", "names"), [
    (["--policies", "fcfs,nope"], "--policies: unknown 'nope'"),
    (["--routers", "weighted,nope"], "--routers: unknown 'nope'"),
    (["--policies", "countdown"], "Mooncake has no hidden states"),
])
def test_bad_flags_exit_2_with_one_line(argv, names, capsys):
    with pytest.raises(SystemExit) as stop:
        prefix_study.main(argv)
    assert stop.value.code == 2
    assert names in capsys.readouterr().err


def test_sharegpt_turns_runs_every_order_and_resumes(tmp_path, capsys):
    figures = tmp_path / "runs.json"
    argv = ["--trace", "sharegpt-turns", "--replicas", "2", "--kv-blocks", "128", "--block-size", "32", "--seeds", "1",
            "--routers", "weighted", "--policies", "fcfs,countdown", "--json", str(figures)]
    assert prefix_study.main(argv) == 0
    rows = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| weighted")]
    assert [x.split(" | ")[1] for x in rows] == ["fcfs", "countdown + leap-rls"]
    runs = json.loads(figures.read_text())
    assert len(runs) == 2 and all(0 < r["prefix_hit_rate"] < 1 for r in runs.values())
    assert prefix_study.main(argv) == 0   # every run reused from the json
    assert [x for x in capsys.readouterr().out.splitlines() if x.startswith("| weighted")] == rows
