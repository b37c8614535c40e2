"""CI regression: golden summary figures of a fixed set of runs on the bundled traces."""

from __future__ import annotations

import json

import pytest

from policies import POLICIES
from policies.fcfs import FCFS
from experiments import golden


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "golden-cache"))


def test_golden_file_covers_every_available_run():
    stored = json.loads(golden.GOLDEN_PATH.read_text())["runs"]
    missing = [golden.run_id(r) for r in golden.available_runs() if golden.run_id(r) not in stored]
    assert not missing, f"golden runs not recorded yet, run `python -m experiments.golden --update`: {missing}"


def test_golden_figures_match():
    failures = golden.check()
    assert not failures, "results moved; if intended, run `python -m experiments.golden --update`:\n" + \
        "\n".join(f"{k}: {v}" for k, v in failures.items())


def test_golden_catches_countdown_swapped_for_fcfs(monkeypatch):
    monkeypatch.setitem(POLICIES, "countdown", FCFS)
    failures = golden.check()
    countdown_runs = [rid for rid in json.loads(golden.GOLDEN_PATH.read_text())["runs"] if "/countdown/" in rid]
    assert countdown_runs and all(rid in failures for rid in countdown_runs)
    assert all("/fcfs/" not in rid for rid in failures)


def test_compare_tolerances():
    base = {k: 1.0 for k in golden.FIELDS}
    assert golden.compare(base, dict(base)) == []
    assert golden.compare(base, {**base, "mean_ptl_s": 1.00001}) == []
    assert golden.compare(base, {**base, "mean_ptl_s": 1.001})
    assert golden.compare(base, {**base, "spearman": None})
