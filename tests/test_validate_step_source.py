"""``leap-validate`` on a step-clocked run whose source trace is not under traces/: the refusal
names ``--source PATH``, and ``--source`` then finds the source by its content hash (it used to
answer that --source applies to wall-clock serving runs only)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.validate import main as validate_main
from simulator.serving import GIVEN_SOURCES

ROOT = Path(__file__).resolve().parents[1]
RUN = "alpaca200-steps-leap-0.8"


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """The run and its read-out in one folder, its source (alpaca) in another; traces/ holds only
    the read-out's training trace (lmsys)."""
    bundled, runs, src = tmp_path / "traces", tmp_path / "runs", tmp_path / "mine"
    for folder in (bundled, runs, src):
        folder.mkdir()
    for path in (ROOT / "traces" / "live").glob(f"{RUN}.*"):
        shutil.copy(path, runs / path.name)
    shutil.copy(ROOT / "traces" / "live" / "leap_readout_lmsys.npz", runs)
    for path in (ROOT / "traces").glob("alpaca.*"):
        shutil.copy(path, src / path.name)
    for path in (ROOT / "traces").glob("lmsys.*"):
        shutil.copy(path, bundled / path.name)
    monkeypatch.setenv("LEAP_TRACES_DIR", str(bundled))
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    yield runs / f"{RUN}.parquet", src / "alpaca.parquet"
    GIVEN_SOURCES.clear()


def test_a_step_clocked_run_takes_its_source_by_path(elsewhere, capsys):
    run, source = elsewhere
    assert validate_main([str(run), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its source trace 'alpaca' is not available here" in err and "--source" in err
    assert validate_main([str(run), "--source", str(source), "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert row["run"] == RUN and row["clock"] == "steps" and row["finish_step_match_share"] == 1.0


def test_source_without_a_serving_run_names_what_it_applies_to(elsewhere, capsys):
    _, source = elsewhere
    assert validate_main([str(source), "--source", str(source)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--source applies to serving runs (wall-clock or step-clocked)" in err
