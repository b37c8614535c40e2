"""The trace contract: every reader rejects a bad trace with one message naming file, column, row."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.trace import METADATA_KEY, TraceError, bundled_trace_names, load_trace, trace_from_arrays, trace_metadata


def write(tmp_path, table, name="t.parquet"):
    path = tmp_path / name
    pq.write_table(table, path)
    return path


def good_table(n=5, hidden=4, **meta):
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(n, hidden)).astype(np.float16)
    table = pa.table({
        "request_id": [f"r{i}" for i in range(n)],
        "domain": ["d"] * n,
        "prompt_id": [f"p{i}" for i in range(n)],
        "prompt_tokens": pa.array(np.arange(1, n + 1), pa.int32()),
        "output_tokens": pa.array(np.arange(10, 10 + n), pa.int32()),
        "finish_reason": ["stop"] * n,
        "max_tokens": pa.array([64] * n, pa.int32()),
        "feat_last": pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1)), hidden),
    })
    return table.replace_schema_metadata(trace_metadata(hidden_size=hidden, layers={"feat_last": 2}, **meta))


def test_good_trace_loads_with_features(tmp_path):
    trace = load_trace(write(tmp_path, good_table()))
    assert len(trace) == 5
    assert trace.feature("feat_last").shape == (5, 4)
    assert trace.feature_layer("feat_last") == 2
    assert list(trace.output_tokens) == [10, 11, 12, 13, 14]


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.drop_columns(["output_tokens"]), "missing required column(s) output_tokens"),
    (lambda t: t.set_column(4, "output_tokens", pa.array([10, 0, 3, 4, 5], pa.int32())),
     "column output_tokens: row 1: must be >= 1"),
    (lambda t: t.set_column(0, "request_id", pa.array(["a", "b", "a", "c", "d"])),
     "column request_id: row 2: duplicate id 'a'"),
    (lambda t: t.set_column(5, "finish_reason", pa.array(["stop", "stop", "eos", "stop", "stop"])),
     "column finish_reason: row 2"),
    (lambda t: t.set_column(4, "output_tokens", pa.array([10, 11, 99, 13, 14], pa.int32())),
     "row 2: 99 exceeds max_tokens 64"),
    (lambda t: t.set_column(3, "prompt_tokens", pa.array([1.0, 2, 3, 4, 5])), "column prompt_tokens: expected integer"),
    (lambda t: t.append_column("arrival_s", pa.array([0.0, 1.0, float("nan"), 2.0, 3.0])),
     "column arrival_s: row 2: nan is not a finite"),
])
def test_bad_column_is_named_with_row(tmp_path, mutate, message):
    table = good_table()
    bad = mutate(table).replace_schema_metadata(table.schema.metadata)
    with pytest.raises(TraceError) as err:
        load_trace(write(tmp_path, bad))
    assert message in str(err.value)
    assert "t.parquet" in str(err.value)


def test_non_finite_vector_and_wrong_width(tmp_path):
    table = good_table()
    feats = np.ones((5, 4), dtype=np.float32)
    feats[3, 1] = np.nan
    bad = table.set_column(7, "feat_last", pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1)), 4))
    with pytest.raises(TraceError, match="column feat_last: row 3: non-finite"):
        load_trace(write(tmp_path, bad.replace_schema_metadata(table.schema.metadata)))
    wrong = good_table(hidden=3).replace_schema_metadata(trace_metadata(hidden_size=4))
    with pytest.raises(TraceError, match="vector length 3 differs from declared hidden_size 4"):
        load_trace(write(tmp_path, wrong, "w.parquet"))


def test_schema_version_and_metadata(tmp_path):
    table = good_table()
    with pytest.raises(TraceError, match="missing Parquet metadata"):
        load_trace(write(tmp_path, table.replace_schema_metadata({}), "a.parquet"))
    meta = {METADATA_KEY: json.dumps({"schema_version": 99}).encode()}
    with pytest.raises(TraceError, match="schema_version 99 is not supported"):
        load_trace(write(tmp_path, table.replace_schema_metadata(meta), "b.parquet"))


def test_not_parquet_and_missing(tmp_path):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"this is not parquet")
    with pytest.raises(TraceError, match="not a readable Parquet file"):
        load_trace(junk)
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.parquet")
    with pytest.raises(TraceError, match="not a file and not a bundled trace"):
        load_trace("no-such-bundled-trace")


def test_steps_side_table_validated(tmp_path):
    write(tmp_path, good_table(), "s.parquet")
    pq.write_table(pa.table({"step_index": [0, 1], "step_s": [0.1, -1.0], "prefill_tokens": [3, 0],
                             "decode_requests": [0, 2]}), tmp_path / "s.steps.parquet")
    with pytest.raises(TraceError, match="s.steps.parquet: column step_s: row 1"):
        load_trace(tmp_path / "s.parquet")
    pq.write_table(pa.table({"step_index": [0, 1], "step_s": [0.1, 0.2], "prefill_tokens": [3, None],
                             "decode_requests": [0, 2]}), tmp_path / "s.steps.parquet")
    with pytest.raises(TraceError, match="s.steps.parquet: column prefill_tokens: row 1: missing value"):
        load_trace(tmp_path / "s.parquet")


def test_null_arrival_times_mean_unknown(tmp_path):
    table = good_table()
    nulls = table.append_column("arrival_s", pa.array([0.0, None, 1.0, 2.0, 3.0], pa.float64()))
    assert load_trace(write(tmp_path, nulls.replace_schema_metadata(table.schema.metadata))).arrival_s is None


def test_decode_side_table_rejects_unknown_ids(tmp_path):
    write(tmp_path, good_table(), "d.parquet")
    vec = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(8, np.float16)), 4)
    pq.write_table(pa.table({"request_id": ["r0", "zz"], "generated_tokens": [8, 8], "layer": [2, 2],
                             "vector": vec}), tmp_path / "d.decode.parquet")
    trace = load_trace(tmp_path / "d.parquet")
    with pytest.raises(TraceError, match="row 1: unknown request id 'zz'"):
        trace.decode_features()


def test_every_bundled_trace_passes_the_validator():
    names = bundled_trace_names()
    assert "sharegpt-lengths" in names
    for name in names:
        trace = load_trace(name)
        assert len(trace) > 0
        assert trace.metadata["schema_version"] == 1


def test_in_memory_trace_and_take():
    trace = trace_from_arrays("x", [3, 4, 5], [7, 8, 9], features={"feat_last": np.eye(3)})
    sub = trace.take(np.array([2, 0]))
    assert list(sub.output_tokens) == [9, 7]
    assert sub.feature("feat_last")[0, 2] == 1.0
    assert sub.content_hash != trace.content_hash
