"""Inputs that used to break `simulate` after the checks: each gives one line naming the problem,
exit 2 and nothing left behind (issue 12)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import experiments.cli as cli
from core.contract import MAX_REQUEST_TOKENS
from core.trace import TraceError, load_trace, trace_metadata
from experiments.cli import main

TRACE = "sharegpt-lengths"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def one_error_line(capsys, fragment):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("simulate: error: ") and fragment in err, err


def table(output_tokens, max_tokens, n=4):
    return pa.table({
        "request_id": [f"r{i}" for i in range(n)], "domain": ["d"] * n, "prompt_id": [f"p{i}" for i in range(n)],
        "prompt_tokens": pa.array([5] * n, pa.int32()),
        "output_tokens": pa.array([10] * (n - 1) + [output_tokens], pa.int32()),
        "finish_reason": ["stop"] * n, "max_tokens": pa.array([max_tokens] * n, pa.int32()),
    }).replace_schema_metadata(trace_metadata())


@pytest.mark.parametrize("seed,seeds", [(2**63, 1), (2**63 - 1, 2), (2**70, 1)])
def test_seed_beyond_int64_is_refused_before_anything_is_written(tmp_path, capsys, seed, seeds):
    out = tmp_path / "runs"
    assert main(["--trace", TRACE, "--requests", "30", "--seed", str(seed), "--seeds", str(seeds),
                 "--out", str(out), "--quiet"]) == 2
    one_error_line(capsys, "seeds must stay below 2**63")
    assert not out.exists()


def test_largest_seed_runs_and_writes(tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["--trace", TRACE, "--requests", "30", "--seed", str(2**63 - 1), "--predictor", "none",
                 "--out", str(out), "--json"]) == 0
    assert pq.read_table(out / "results.parquet").column("seed").to_pylist() == [2**63 - 1]


def test_output_tokens_beyond_any_context_is_refused(tmp_path, capsys):
    path = tmp_path / "huge.parquet"
    pq.write_table(table(2**31 - 1, 2**31 - 1), path)   # within max_tokens, but hours of replay
    assert main(["--trace", str(path), "--predictor", "none", "--json"]) == 2
    one_error_line(capsys, f"{path}: column output_tokens: row 3: 2147483647 tokens is beyond any model's context")
    pq.write_table(table(10, MAX_REQUEST_TOKENS + 1), path)
    with pytest.raises(TraceError, match="column max_tokens: row 0"):
        load_trace(path)
    pq.write_table(table(MAX_REQUEST_TOKENS, MAX_REQUEST_TOKENS), path)   # the limit itself is allowed
    assert load_trace(path).output_tokens[-1] == MAX_REQUEST_TOKENS


def test_output_tokens_above_max_tokens_is_refused(tmp_path):
    path = tmp_path / "over.parquet"
    pq.write_table(table(65, 64), path)
    with pytest.raises(TraceError, match="column output_tokens: row 3: 65 exceeds max_tokens 64"):
        load_trace(path)


def test_decode_vectors_reject_unknown_request_ids(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(table(10, 64), path)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(8, np.float16)), 4)
    pq.write_table(pa.table({"request_id": ["r0", "zz"], "generated_tokens": pa.array([8, 8], pa.int32()),
                             "layer": pa.array([2, 2], pa.int16()), "vector": vec}), tmp_path / "d.decode.parquet")
    trace = load_trace(path)
    with pytest.raises(TraceError, match=r"d.decode.parquet: column request_id: row 1: unknown request id 'zz'"):
        trace.decode_vectors(2)
    with pytest.raises(TraceError, match="unknown request id 'zz'"):
        trace.take(np.array([0, 1])).decode_vectors(2)


@pytest.mark.parametrize("runs", [["--load", "1x"], ["--load", "1x,2x", "--jobs", "1"]])
def test_no_empty_run_folders_after_an_error(tmp_path, capsys, monkeypatch, runs):
    def fail(*args, **kwargs):
        raise ValueError("worker failed")

    monkeypatch.setattr(cli, "run_many", fail)
    out = tmp_path / "a" / "runs"
    assert main(["--trace", TRACE, "--requests", "30", "--predictor", "none", *runs, "--out", str(out)]) == 2
    one_error_line(capsys, "worker failed")
    assert not (tmp_path / "a").exists() and tmp_path.exists()


def test_an_existing_out_folder_is_kept_after_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "run_many", lambda *a, **k: (_ for _ in ()).throw(ValueError("worker failed")))
    out = tmp_path / "runs"
    out.mkdir()
    assert main(["--trace", TRACE, "--requests", "30", "--predictor", "none", "--load", "1x,2x", "--out", str(out)]) == 2
    assert out.is_dir() and list(out.iterdir()) == []
