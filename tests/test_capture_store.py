"""Crash-safety of the capture part store and the final assembly (numpy + pyarrow only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capture import CaptureError  # noqa: E402
from capture.backend import Finished, GenRequest  # noqa: E402
from capture.finalize import finalize  # noqa: E402
from capture.prompts import Prompt  # noqa: E402
from capture.schema import dec_table, feat_table, gen_table, steps_table  # noqa: E402
from capture.store import PartStore  # noqa: E402

D = 8
CONFIG = {"model_revision": "abc", "layers": {"feat_last": 3}, "prefill_features": True,
          "decode_every_k": 2, "sampling": {"temperature": 0.7}}


def _prompts(n):
    return [Prompt("dom", f"p{i}", f"text {i}", keep_text=(i % 2 == 0)) for i in range(n)]


def _fin(p, n_out=5, seed=0):
    rng = np.random.default_rng(seed)
    req = GenRequest(p.request_id, list(range(3 + seed)))
    return Finished(request=req, output_tokens=n_out, finish_reason="stop",
                    token_times_s=[0.1 * (i + 1) for i in range(n_out)],
                    last={3: rng.normal(size=D).astype(np.float32)},
                    decode=[(g, 1, rng.normal(size=D).astype(np.float32)) for g in (2, 4)])


def _write(store, prompts, fins, with_feat=True):
    by_id = {p.request_id: p for p in prompts}
    store.write("dec", dec_table(fins, D))
    store.write("gen", gen_table(fins, by_id, {}, 16, ["feat_last"], [3], D, True))
    store.write("steps", steps_table([{"run": store.run, "run_step": i, "wall_start_s": 0.1 * i,
                                       "step_s": 0.05, "prefill_requests": 1, "prefill_tokens": 3,
                                       "decode_requests": 0, "decode_tokens": 0, "kv_usage": 0.1}
                                      for i in range(3)]))
    if with_feat:
        store.write("feat", feat_table({
            "request_id": [f.request.request_id for f in fins],
            "feat_mean": [np.ones(D, np.float32)] * len(fins),
            "feat_entropy_pooled": [np.ones(D, np.float32)] * len(fins),
            "text_embedding": [np.ones(384, np.float32) / 384 ** 0.5] * len(fins)}, D))


def _meta():
    return {"schema_version": 1, "layers": {"feat_last": 3}, "hidden_size": D,
            "run_config": CONFIG, "sampling": {"temperature": 0.7}, "decode_every_k": 2,
            "decode_layers": [1]}


def test_kill_duplicates_and_strays_are_resolved(tmp_path):
    out = tmp_path / "t.parquet"
    ps = _prompts(4)
    store = PartStore(out)
    store.open(CONFIG, resume=False)
    _write(store, ps, [_fin(ps[0]), _fin(ps[1], seed=1)])
    # a "killed" run: decode rows of p2 written, its gen part never was
    store.write("dec", dec_table([_fin(ps[2])], D))
    # resume: new run number, p1 finished again (duplicate), p2 and p3 done now
    store2 = PartStore(out)
    store2.open(CONFIG, resume=True)
    assert store2.run == 1
    assert store2.done_ids("gen") == {"dom:p0", "dom:p1"}
    _write(store2, ps, [_fin(ps[1], seed=7), _fin(ps[2], seed=2), _fin(ps[3], seed=3)])
    finalize(store2, ps, _meta(), {"backend": "test", "backend_version": "0", "eager": True},
             hidden=D, log=lambda *a: None)
    assert out.exists() and not store2.dir.exists()
    t = pq.read_table(out)
    assert t.column("request_id").to_pylist() == [p.request_id for p in ps]
    assert t.column("prompt_text").to_pylist() == ["text 0", None, "text 2", None]
    # the first recorded copy of p1 is kept
    first_p1 = _fin(ps[1], seed=1).last[3].astype(np.float16)
    got = t.column("feat_last").combine_chunks().values.to_numpy(zero_copy_only=False).reshape(4, D)
    assert np.array_equal(got[1], first_p1)
    dec = pq.read_table(tmp_path / "t.decode.parquet")
    keys = list(zip(dec.column("request_id").to_pylist(), dec.column("generated_tokens").to_pylist()))
    assert len(keys) == len(set(keys)) == 8
    steps = pq.read_table(tmp_path / "t.steps.parquet")
    assert steps.column("step_index").to_pylist() == list(range(6))
    assert steps.column("run").to_pylist() == [0, 0, 0, 1, 1, 1]
    meta = json.loads(t.schema.metadata[b"leap.trace"])
    assert meta["prefill_pass_columns"] == ["feat_mean", "feat_entropy_pooled", "text_embedding"]
    try:
        from core.trace import load_trace
    except ImportError:
        return
    tr = load_trace(out)
    assert len(tr) == 4 and tr.decode_features().num_rows == 8


def test_resume_with_other_settings_is_refused(tmp_path):
    out = tmp_path / "t.parquet"
    PartStore(out).open(CONFIG, resume=False)
    with pytest.raises(CaptureError, match="sampling"):
        PartStore(out).open({**CONFIG, "sampling": {"temperature": 1.0}}, resume=True)


def test_missing_requests_block_finalize(tmp_path):
    out = tmp_path / "t.parquet"
    ps = _prompts(3)
    store = PartStore(out)
    store.open(CONFIG, resume=False)
    _write(store, ps, [_fin(ps[0])])
    with pytest.raises(CaptureError, match="not recorded"):
        finalize(store, ps, _meta(), None, hidden=D, log=lambda *a: None)
    assert not out.exists() and store.dir.exists()


def test_final_trace_seeds_a_resume(tmp_path):
    out = tmp_path / "t.parquet"
    ps = _prompts(3)
    store = PartStore(out)
    store.open(CONFIG, resume=False)
    _write(store, ps, [_fin(ps[0]), _fin(ps[1])])
    finalize(store, ps[:2], _meta(), {"backend": "test"}, hidden=D, log=lambda *a: None)
    again = PartStore(out)
    again.open(CONFIG, resume=True)  # seeds parts from the final files
    assert again.done_ids("gen") == {"dom:p0", "dom:p1"}
    assert again.done_ids("feat") == {"dom:p0", "dom:p1"}
    _write(again, ps, [_fin(ps[2])])
    finalize(again, ps, _meta(), {"backend": "test"}, hidden=D, log=lambda *a: None)
    t = pq.read_table(out)
    assert t.column("request_id").to_pylist() == ["dom:p0", "dom:p1", "dom:p2"]
    assert pq.read_table(tmp_path / "t.decode.parquet").num_rows == 6


def test_partial_finalize_keeps_the_parts(tmp_path):
    """--finalize-partial writes the finished requests but keeps the parts folder: a resume then
    still has the prefill features of prompts not yet generated (seeding from the final file
    would drop them)."""
    out = tmp_path / "t.parquet"
    ps = _prompts(3)
    store = PartStore(out)
    store.open(CONFIG, resume=False)
    _write(store, ps, [_fin(ps[0]), _fin(ps[1])])
    store.write("feat", feat_table({"request_id": [ps[2].request_id], "feat_mean": [np.ones(D, np.float32)],
                                    "feat_entropy_pooled": [np.ones(D, np.float32)],
                                    "text_embedding": [np.ones(384, np.float32) / 384 ** 0.5]}, D))
    finalize(store, ps[:2], dict(_meta(), complete=False), {"backend": "test"}, hidden=D, log=lambda *a: None)
    assert pq.read_table(out).num_rows == 2 and store.dir.is_dir()
    again = PartStore(out)
    again.open(CONFIG, resume=True)
    assert again.done_ids("feat") == {p.request_id for p in ps}
    _write(again, ps, [_fin(ps[2])], with_feat=False)
    finalize(again, ps, dict(_meta(), complete=True), {"backend": "test"}, hidden=D, log=lambda *a: None)
    assert pq.read_table(out).column("request_id").to_pylist() == [p.request_id for p in ps]
    assert not again.dir.exists()


def test_report_helpers():
    from capture.report import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2, 2], [1, 1, 2, 2]) == pytest.approx(1.0)  # ties


def test_capture_report_reads_traces_and_skips_side_tables(tmp_path):
    from capture.report import report_rows
    traces = ROOT / "traces"
    if not (traces / "multilingual.parquet").is_file():
        pytest.skip("traces/multilingual.parquet not recorded")
    rows = report_rows([traces / "multilingual.parquet", traces / "multilingual.decode.parquet",
                        traces / "multilingual.steps.parquet"])
    assert {r["trace"] for r in rows} == {"multilingual.parquet"}
    total = rows[-1]
    assert total["domain"] == "(all)" and total["requests"] == sum(r["requests"] for r in rows[:-1])
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "other.parquet")
    with pytest.raises(CaptureError, match="other.parquet: not a recorded trace"):
        report_rows([tmp_path / "other.parquet"])


def test_resume_may_narrow_the_prompt_list(tmp_path):
    """A recording planned over p0..p5 and resumed over p0..p2 (the rest handed to another shard)
    finalizes with exactly p0..p2 and their decode rows, whatever else was recorded."""
    out = tmp_path / "t.parquet"
    ps = _prompts(6)
    store = PartStore(out)
    store.open(CONFIG, resume=False)
    _write(store, ps, [_fin(ps[0]), _fin(ps[1], seed=1), _fin(ps[4], seed=4)])
    narrowed = PartStore(out)
    narrowed.open(CONFIG, resume=True)
    _write(narrowed, ps, [_fin(ps[2], seed=2)])
    finalize(narrowed, ps[:3], _meta(), {"backend": "test"}, hidden=D, log=lambda *a: None)
    t = pq.read_table(out)
    assert t.column("request_id").to_pylist() == [p.request_id for p in ps[:3]]
    dec = pq.read_table(tmp_path / "t.decode.parquet")
    assert set(dec.column("request_id").to_pylist()) == {p.request_id for p in ps[:3]}


def test_float_lists_are_byte_stream_split_and_repack_keeps_content(tmp_path):
    from capture.store import atomic_write_table, repack
    rng = np.random.default_rng(0)
    vec16 = pa.FixedSizeListArray.from_arrays(pa.array(rng.normal(size=4 * D).astype(np.float16)), D)
    vec32 = pa.FixedSizeListArray.from_arrays(pa.array(rng.normal(size=4 * D).astype(np.float32)), D)
    times = pa.array([[0.1, 0.2], None, [0.3], []], type=pa.list_(pa.float64()))
    table = pa.table({"request_id": ["a", "b", "c", "d"], "v16": vec16, "v32": vec32, "t": times})
    path = tmp_path / "x.parquet"
    atomic_write_table(table, path, {"schema_version": 1})
    encodings = {}
    meta = pq.ParquetFile(path).metadata.row_group(0)
    for i in range(meta.num_columns):
        encodings[meta.column(i).path_in_schema] = meta.column(i).encodings
    for col in ("v16.list.element", "v32.list.element", "t.list.element"):
        assert "BYTE_STREAM_SPLIT" in encodings[col], (col, encodings[col])
    assert "BYTE_STREAM_SPLIT" not in encodings["request_id"]
    before = pq.read_table(path)
    repack(path)
    after = pq.read_table(path)
    assert after.equals(before) and after.schema.metadata == before.schema.metadata
    assert after.column("v16").type.value_type == pa.float16()
