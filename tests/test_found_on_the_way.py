"""Faults found while validating live runs: a batch recording that would not replay closed-loop,
leap-validate's FCFS reference and source trace chosen without a word, and leap-serve checks that
came only after the engine had started (they need no engine now, so no vLLM here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from capture import CaptureError
from core.trace import load_trace, traces_dir
from experiments.cli import main as simulate_main
from experiments.validate import main as validate_main
from live import prechecks
from simulator.preset import closed_loop_window

LIVE = traces_dir() / "live"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _copy_trace(src: Path, dst: Path) -> Path:
    """A trace file and its side tables under another name."""
    stem = src.name.removesuffix(".parquet")
    for side in src.parent.glob(f"{stem}.*parquet"):
        shutil.copy(side, dst.parent / side.name.replace(stem, dst.name.removesuffix(".parquet"), 1))
    return dst


def test_a_batch_recording_with_submission_times_replays_closed_loop(tmp_path, capsys):
    """Today's capture-traces stores each request's submission offset as arrival_s in a batch
    recording too; it is still a closed loop (no serving metadata)."""
    math = load_trace("math")
    table = pq.read_table(math.path)
    offsets = np.arange(table.num_rows, dtype=np.float64) * 0.01
    path = tmp_path / "batch.parquet"
    column = pa.array(offsets)   # the bundled recordings hold the column, all null
    table = (table.set_column(table.column_names.index("arrival_s"), "arrival_s", column)
             if "arrival_s" in table.column_names else table.append_column("arrival_s", column))
    pq.write_table(table.replace_schema_metadata(pq.read_schema(math.path).metadata), path)
    out = tmp_path / "run"
    assert simulate_main(["--trace", str(path), "--arrivals", "closed", "--predictor", "none", "--requests", "40",
                          "--out", str(out), "--json", "--quiet"]) == 0, capsys.readouterr().err
    assert load_trace(path).arrival_s is not None
    assert json.loads((out / "config.json").read_text())["closed_loop_window"] == closed_loop_window(math)


def test_a_serving_run_is_still_refused_closed_loop(capsys):
    assert simulate_main(["--trace", str(LIVE / "alpaca200-fcfs-0.8.parquet"), "--arrivals", "closed",
                          "--predictor", "none"]) == 2
    assert "is not a closed-loop batch recording" in capsys.readouterr().err


# ------------------------------------------------------------------ leap-validate: reference and source


@pytest.fixture(scope="module")
def two_fcfs_runs(tmp_path_factory):
    """A folder with the oracle run at 0.8x and two FCFS runs of the same workload and load."""
    folder = tmp_path_factory.mktemp("live")
    for name in ("alpaca200-oracle-0.8", "alpaca200-fcfs-0.8"):
        _copy_trace(LIVE / f"{name}.parquet", folder / f"{name}.parquet")
    _copy_trace(LIVE / "alpaca200-fcfs-0.8.parquet", folder / "alpaca200-fcfs-0.8-repeat.parquet")
    return folder


def test_validate_names_the_fcfs_reference_and_takes_the_users(two_fcfs_runs, capsys):
    run = two_fcfs_runs / "alpaca200-oracle-0.8.parquet"
    both = {"alpaca200-fcfs-0.8", "alpaca200-fcfs-0.8-repeat"}

    def validate(*extra):
        assert validate_main([str(run), "--json", *extra]) == 0
        out, err = capsys.readouterr()
        row = next(r for r in map(json.loads, out.splitlines()) if r["run"] == "alpaca200-oracle-0.8")
        assert f"leap-validate: note: alpaca200-oracle-0.8: FCFS reference {row['fcfs_run']} (" in err, err
        return row["fcfs_run"]

    default = validate()
    assert default in both
    other = (both - {default}).pop()
    assert validate("--reference", str(two_fcfs_runs / f"{other}.parquet")) == other


@pytest.mark.parametrize("reference, fragment", [
    ("alpaca200-oracle-0.8", "not an FCFS serving run"),
    ("alpaca200-fcfs-1.3", "not a run of the same workload and load"),
])
def test_validate_refuses_a_reference_that_is_not_the_runs_fcfs(reference, fragment, capsys):
    assert validate_main([str(LIVE / "alpaca200-leap-0.8.parquet"), "--reference",
                          str(LIVE / f"{reference}.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_validate_takes_a_source_trace_by_path_and_checks_its_hash(tmp_path, capsys):
    from simulator.serving import GIVEN_SOURCES, source_trace

    run = load_trace(LIVE / "alpaca200-fcfs-0.8.parquet")
    good = _copy_trace(load_trace("alpaca").path, tmp_path / "alpaca.parquet")
    wrong = tmp_path / "other" / "alpaca.parquet"
    wrong.parent.mkdir()
    _copy_trace(load_trace("math").path, wrong)
    assert validate_main([str(run.path), "--source", str(wrong)]) == 2
    assert "content hash" in capsys.readouterr().err and not GIVEN_SOURCES
    from experiments.validate_choices import register_sources

    try:
        register_sources([load_trace(good)], [run])
        assert source_trace(run).path == good     # found by hash, not under traces/
    finally:
        GIVEN_SOURCES.clear()


# ------------------------------------------------------------------ leap-serve, before the engine


def test_resume_with_nothing_to_resume(tmp_path):
    with pytest.raises(CaptureError, match="--resume: nothing to resume at"):
        prechecks.check_resume(True, tmp_path / "run.parquet")
    (tmp_path / "run.parquet.parts").mkdir()
    prechecks.check_resume(True, tmp_path / "run.parquet")   # a crashed run's parts: resumable


@pytest.mark.parametrize("text, fragment", [("", "empty CSV"), ("arrival_s\n1.0\n", "at least two"),
                                            ("arrival_s\n0\n-2\n", "row 1")])
def test_an_arrivals_csv_that_cannot_serve_is_refused(text, fragment, tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(text)
    with pytest.raises(CaptureError, match=fragment):
        prechecks.check_arrivals_file(str(path))


@pytest.mark.parametrize("meta, columns, texts, fragment", [
    ({}, ["request_id"], [], "the trace has no prompt text and names no prompt source"),
    ({"prompt_sources": ["jsonl:mine.jsonl@sha256:0123456789ab"]}, ["request_id"], [],
     "the trace has no prompt text, and its prompt source jsonl:mine.jsonl@sha256:0123456789ab is not a file"),
    ({}, ["prompt_text"], ["hi", None], "lacks the prompt text of some requests"),
])
def test_a_trace_without_prompt_text_says_so(meta, columns, texts, fragment):
    with pytest.raises(CaptureError, match=fragment):
        prechecks.check_prompt_text("t.parquet", meta, columns, texts)


def test_prompt_text_present_passes():
    prechecks.check_prompt_text("t.parquet", {}, ["prompt_text"], ["a", "b"])


def test_a_readout_of_another_width_is_refused_before_the_engine(tmp_path):
    """A read-out for hidden size 576 against a model whose config says 64 (leap_sched.vllm.check's check)."""
    from live.config import LiveSchedulerConfig

    readout = LIVE / "leap_readout_lmsys.npz"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 30,
                                                   "num_attention_heads": 4, "num_key_value_heads": 1}))
    live = LiveSchedulerConfig(policy="countdown", predictor="leap", max_resident=4, decode_slots=2,
                               readout=str(readout))
    with pytest.raises(CaptureError, match=r"live scheduler: read-out .* is for hidden size 576, but the model"):
        prechecks.check_readout(live, model, 4, "float32")
    prechecks.check_readout(None, model, 4, "float32")   # vLLM's own scheduler: no read-out
