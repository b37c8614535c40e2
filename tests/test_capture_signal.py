"""capture-traces signal reads out with LEAP's own fit, and the capture subcommands' bad input
(repack, prepare-model, signal, a model folder without weights): one line, exit 2, nothing left."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capture import CaptureError  # noqa: E402
from capture.cli import main  # noqa: E402
from capture.report import signal_rows  # noqa: E402
from core.metrics import spearman  # noqa: E402
from core.readout import CV_FOLDS, CV_SEED, fit_readout, out_of_fold_predictions  # noqa: E402
from core.trace import METADATA_KEY, load_trace, trace_from_arrays  # noqa: E402
from predictors.leap import Leap  # noqa: E402

D = 12


def _write_trace(path: Path, n: int, seed: int, domains=("a",), nan_row: int | None = None) -> Path:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)).astype(np.float32)
    w = np.linspace(-1, 1, D)
    lengths = np.clip(np.round((8 + 3 * X @ w + rng.normal(size=n)) ** 2), 1, 400).astype(np.int32)
    t = trace_from_arrays(path.stem, np.full(n, 5), lengths, max_tokens=400, features={"feat_last": X},
                          metadata={"layers": {"feat_last": 3}})
    table = t.table
    dom = [domains[i % len(domains)] for i in range(n)]
    table = table.set_column(table.column_names.index("domain"), "domain", __import__("pyarrow").array(dom))
    if nan_row is not None:
        import pyarrow as pa
        Xn = X.copy()
        Xn[nan_row, 0] = np.nan
        col = pa.FixedSizeListArray.from_arrays(pa.array(Xn.reshape(-1)), D)
        table = table.set_column(table.column_names.index("feat_last"), "feat_last", col)
    meta = {"schema_version": 1, "hidden_size": D, "layers": {"feat_last": 3}}
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()}), path)
    return path


def test_signal_equals_the_leap_predictor_on_the_same_split(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    train = _write_trace(tmp_path / "train.parquet", 300, 0)
    other = _write_trace(tmp_path / "other.parquet", 200, 1, domains=("x", "y"))
    head, rows = signal_rows(train, [train, other])
    # the same figure through the simulator's predictor
    leap = Leap(str(train))
    workload = load_trace(other)
    leap.bind(workload, np.random.default_rng(0))
    pred = leap.predict(np.arange(len(workload)))
    by_domain = {r["domain"]: r["spearman"] for r in rows}
    assert set(by_domain) == {"x", "y", "(all)"}
    assert by_domain["(all)"] == spearman(pred, workload.output_tokens)
    m = workload.domain == "x"
    assert by_domain["x"] == spearman(pred[m], workload.output_tokens[m])
    assert head["alpha"] == leap.readout.alpha
    # in-sample: LEAP's fit on each of its own CV folds' training part
    t = load_trace(train)
    oof = np.empty(len(t))
    for part in np.array_split(np.random.default_rng(CV_SEED).permutation(len(t)), CV_FOLDS):
        r, _ = fit_readout(t.take(np.setdiff1d(np.arange(len(t)), part)), use_cache=False)
        oof[part] = Leap(t.take(np.setdiff1d(np.arange(len(t)), part)), use_cache=False).readout.predict_workload(
            t.feature("feat_last")[part])
        assert r.alpha is not None
    assert np.array_equal(oof, out_of_fold_predictions(t))
    assert head["cv_spearman"] == spearman(oof, t.output_tokens)
    assert head["cv_spearman"] > 0.5                    # the synthetic signal is there


def test_signal_skips_side_tables_silently(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    train = _write_trace(tmp_path / "train.parquet", 100, 0)
    (tmp_path / "x.steps.parquet").write_bytes(b"junk")      # a glob names side tables too
    (tmp_path / "x.decode.parquet").write_bytes(b"junk")
    other = _write_trace(tmp_path / "o.parquet", 50, 2)
    rc = main(["signal", "--train", str(train), str(train), str(tmp_path / "x.steps.parquet"),
               str(tmp_path / "x.decode.parquet"), str(other)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "steps" not in out and "decode" not in out
    assert [ln.split()[0] for ln in out.splitlines()] == ["train", "o.parquet"]


@pytest.mark.parametrize("where", ["train", "other"])
def test_signal_refuses_nan_features(tmp_path, monkeypatch, capsys, where):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    train = _write_trace(tmp_path / "train.parquet", 60, 0, nan_row=7 if where == "train" else None)
    other = _write_trace(tmp_path / "o.parquet", 40, 2, nan_row=3 if where == "other" else None)
    rc = main(["signal", "--train", str(train), str(other)])
    cap = capsys.readouterr()
    assert rc == 2 and "Spearman" not in cap.out
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "feat_last" in lines[0] and "non-finite" in lines[0], cap.err


def _one_error_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("capture-traces: error:") and "Error:" not in err[0], err
    return err[0]


def test_repack_of_a_file_that_is_not_parquet_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"junk")
    assert main(["repack", str(bad)]) == 2
    assert "bad.parquet" in _one_error_line(capsys)
    assert bad.read_bytes() == b"junk" and sorted(p.name for p in tmp_path.iterdir()) == ["bad.parquet"]


def test_prepare_model_into_a_file_exits_2_before_converting(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (blocker, blocker / "sub"):
        assert main(["prepare-model", "--out", str(out)]) == 2
        assert "not a folder" in _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_model_folder_without_weights_is_refused(tmp_path, capsys):
    from capture.model import check_model_dir

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 8}))
    (model / "tokenizer.json").write_text("{}")
    with pytest.raises(CaptureError, match="no weights file"):
        check_model_dir(str(model))
    out = tmp_path / "t.parquet"
    assert main(["--model", str(model), "--prompts", "alpaca", "--out", str(out)]) == 2
    assert "no weights file" in _one_error_line(capsys)
    assert not out.exists() and not out.with_name(out.name + ".parts").exists()
    (model / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert check_model_dir(str(model)) == model


@pytest.mark.parametrize("argv", [["signal"], ["signal", "--train"], ["report", "--bogus", "x"],
                                  ["signal", "--train", "no-such-trace"]])
def test_signal_and_report_flags_one_line(argv, capsys):
    assert main(argv) == 2
    _one_error_line(capsys)
