"""evaluate-predictors end to end on small synthetic traces written to tmp_path."""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # only effective if numpy is not imported yet

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from core.trace import trace_from_arrays, trace_metadata
from predictors.evaluate import main


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LEAP_TRACES_DIR", str(tmp_path / "bundled"))


def write_trace(path, name, n, *, seed=0, shift=0.0, d=12, columns=("feat_last",), cap=2048):
    rng = np.random.default_rng(seed)
    drng = np.random.default_rng(42)
    w = drng.standard_normal(d)
    w /= np.linalg.norm(w)
    v = drng.standard_normal(d)
    v /= np.linalg.norm(v)
    Z = rng.standard_normal((n, d))
    s = 16 + 8 * (Z @ w) + shift * (Z @ v) + 0.5 * rng.standard_normal(n)
    lengths = np.clip(np.round(np.clip(s, 1, None) ** 2), 1, cap).astype(np.int64)
    features = {}
    layers = {}
    for k, column in enumerate(columns):
        features[column] = (Z * (1 + k) + drng.uniform(-1, 1, d)).astype(np.float16)
        layers[column] = 10 + k
    if not columns:
        features = None
    trace = trace_from_arrays(name, np.full(n, 12), lengths, max_tokens=cap, features=features,
                              metadata={"layers": layers, "num_layers": 30} if columns else {})
    meta = {k: v for k, v in trace.metadata.items() if k != "schema_version"}
    pq.write_table(trace.table.replace_schema_metadata(trace_metadata(**meta)), path)
    return path


@pytest.fixture
def traces(tmp_path):
    return {
        "train": write_trace(tmp_path / "train.parquet", "train", 400, seed=1),
        "near": write_trace(tmp_path / "near.parquet", "near", 120, seed=2),
        "far": write_trace(tmp_path / "far.parquet", "far", 160, seed=3, shift=9.0),
        "plain": write_trace(tmp_path / "plain.parquet", "plain", 20, seed=4, columns=()),
    }


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_rows_per_predictor_and_domain(capsys, traces):
    rc, out, err = run(capsys, "--train-trace", traces["train"], "--trace", traces["near"],
                       "--trace", traces["far"], "--json")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["predictor"], r["domain"]) for r in rows] == [
        ("leap", "near"), ("leap", "far"), ("leap-rls", "near"), ("leap-rls", "far")]
    for r in rows:
        for key in ("n", "spearman", "kendall_tau", "pairwise_accuracy", "mae", "mae_le256",
                    "mae_257_1024", "mae_gt1024"):
            assert key in r
        assert -1 <= r["spearman"] <= 1 and 0 <= r["pairwise_accuracy"] <= 1
    near = {r["predictor"]: r for r in rows if r["domain"] == "near"}
    far = {r["predictor"]: r for r in rows if r["domain"] == "far"}
    assert near["leap"]["spearman"] > 0.8
    assert near["leap"]["online_updates"] == 0 and near["leap-rls"]["online_updates"] == 120 // 8
    assert far["leap-rls"]["spearman"] > far["leap"]["spearman"]


def test_table_and_other_predictors(capsys, traces):
    rc, out, err = run(capsys, "--train-trace", traces["train"], "--trace", traces["near"],
                       "--predictor", "oracle,leap", "--predictor", "noisy-oracle")
    assert rc == 0, err
    assert "Spearman" in out and "oracle" in out and "noisy-oracle" in out
    rc, out, _ = run(capsys, "--train-trace", traces["train"], "--trace", traces["near"],
                     "--predictor", "oracle", "--json")
    row = json.loads(out)
    assert row["spearman"] == pytest.approx(1.0) and row["mae"] == 0.0


@pytest.mark.parametrize("columns", [80, 100])
def test_table_fits_the_terminal_and_wide_keeps_every_column(capsys, traces, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    argv = ("--train-trace", traces["train"], "--trace", traces["near"], "--predictor", "oracle,leap-rls")
    rc, out, err = run(capsys, *argv)
    assert rc == 0, err
    assert max(len(line) for line in out.splitlines()) <= columns and "\u2026" not in out
    for kept in ("predictor", "trace", "domain", "Spearman", "MAE", "120", "leap-rls"):
        assert kept in out
    table, _, note = out.partition(f"not shown at {columns} columns:")
    assert "MAE 257-1024" not in table and " ".join(note.split()).startswith("updates, MAE 257-1024")
    rc, wide, err = run(capsys, *argv, "--wide")
    assert rc == 0, err
    for label in ("updates", "MAE <=256", "MAE 257-1024", "MAE >1024", "pair acc", "Kendall tau", "in-sample"):
        assert label in wide
    assert "\u2026" not in wide and "not shown" not in wide


def test_target_ablation(capsys, traces):
    rc, out, err = run(capsys, "--train-trace", traces["train"], "--trace", traces["near"],
                       "--ablation", "target", "--json")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["target"] for r in rows] == ["length", "sqrt", "log"]
    assert all(r["mae"] is not None and r["lambda"] > 0 for r in rows)
    rc, out, _ = run(capsys, "--train-trace", traces["train"], "--trace", traces["near"],
                     "--ablation", "target")
    assert rc == 0 and "target ablation" in out


def test_layer_ablation(capsys, tmp_path, traces):
    rc, out, err = run(capsys, "--train-trace", traces["train"], "--trace", traces["near"],
                       "--ablation", "layer")
    assert rc == 2 and out == ""   # nothing to compare is bad input, not a success
    assert err.count("\n") == 1 and "--ablation layer: training trace" in err and "feat_last" in err
    cols = ("feat_last", "feat_mean")
    train = write_trace(tmp_path / "train2.parquet", "train2", 300, seed=1, columns=cols)
    test = write_trace(tmp_path / "test2.parquet", "test2", 80, seed=2, columns=cols)
    rc, out, err = run(capsys, "--train-trace", train, "--trace", test, "--ablation", "layer", "--json")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["columns"] for r in rows] == ["feat_last", "feat_mean", "feat_last+feat_mean"]
    assert rows[0]["layers"] == [10] and rows[2]["d"] == 24 and rows[2]["feature_bytes"] == 24 * 4   # trace_from_arrays stores float32


@pytest.mark.parametrize("argv, message", [
    (["--predictor", "nonesuch"], "unknown predictor"),
    (["--trace", "/nonexistent/x.parquet"], "no such file"),
    (["--trace", "PLAIN"], "feat_last"),
    (["--train-trace", "/nonexistent/train.parquet"], "no such file"),
    (["--trace", "not-a-bundled-name"], "not a file and not a bundled trace"),
    (["--update-every", "0"], "update batch"),
])
def test_bad_input_exits_2_with_one_line(capsys, traces, argv, message):
    argv = [traces["plain"] if a == "PLAIN" else a for a in argv]
    defaults = [] if "--train-trace" in argv else ["--train-trace", traces["train"]]
    if "--trace" not in argv:
        defaults += ["--trace", traces["near"]]
    rc, out, err = run(capsys, *defaults, *argv)
    assert rc == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_no_traces_at_all(capsys, traces):
    rc, _, err = run(capsys, "--train-trace", traces["train"])
    assert rc == 2 and "no evaluation trace" in err


def test_default_traces_are_the_bundled_ones_with_features(capsys, tmp_path, traces):
    bundled = tmp_path / "bundled"
    bundled.mkdir()
    write_trace(bundled / "alpha.parquet", "alpha", 40, seed=5)
    write_trace(bundled / "lengths.parquet", "lengths", 10, seed=6, columns=())
    rc, out, err = run(capsys, "--train-trace", traces["train"], "--predictor", "leap", "--json")
    assert rc == 0, err
    assert [json.loads(line)["trace"] for line in out.splitlines()] == ["alpha"]
    assert "skipping bundled trace 'lengths'" in err
