"""capture-traces merge: shard traces recorded with the same settings become one trace.

Shards are cut from the bundled alpaca recording (rows, decode rows and runs split as two
recordings would have made them), so the merged file can be compared with the original.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capture.cli import main  # noqa: E402
from capture.store import atomic_write_table, read_meta  # noqa: E402
from core.trace import METADATA_KEY, side_table_path  # noqa: E402

SOURCE = ROOT / "traces" / "alpaca.parquet"
pytestmark = pytest.mark.skipif(not SOURCE.is_file(), reason=f"{SOURCE} not recorded yet")


def _side(path: Path, name: str):
    t = pq.read_table(side_table_path(path, name))
    return t, json.loads(t.schema.metadata[METADATA_KEY])


def _write_shard(out: Path, rows: slice, meta_changes=None, steps_columns=None):
    """A shard trace holding ``rows`` of the source, its decode rows, and the source's steps
    (plus ``steps_columns``, as a newer recorder writes them)."""
    meta = read_meta(SOURCE)
    main_t = pq.read_table(SOURCE).slice(rows.start, rows.stop - rows.start)
    ids = main_t.column("request_id")
    dec, dec_meta = _side(SOURCE, "decode")
    dec = dec.filter(pc.is_in(dec.column("request_id"), value_set=ids))
    steps, steps_meta = _side(SOURCE, "steps")
    # the shard as an older recorder wrote it (the columns rebuilt since are dropped), plus
    # ``steps_columns`` as a newer one writes them
    newer = ("decode_context", "prefill_sq", "host_gap_s", "rebuilt_exact", "probe_s")
    steps = steps.select([c for c in steps.column_names if c not in newer])
    for name, arr in (steps_columns or {}).items():
        steps = steps.append_column(name, arr(steps.num_rows))
    meta = {**meta, "num_requests": main_t.num_rows, "complete": True, "planned_requests": main_t.num_rows,
            "side_tables": {"decode": side_table_path(out, "decode").name, "steps": side_table_path(out, "steps").name},
            **(meta_changes or {})}
    atomic_write_table(dec.replace_schema_metadata(None), side_table_path(out, "decode"), dict(dec_meta, trace=out.name))
    atomic_write_table(steps.replace_schema_metadata(None), side_table_path(out, "steps"), dict(steps_meta, trace=out.name))
    atomic_write_table(main_t.replace_schema_metadata(None), out, meta)
    return main_t.num_rows


def test_merge_rebuilds_the_recording(tmp_path):
    a, b, out = tmp_path / "t-a.parquet", tmp_path / "t-b.parquet", tmp_path / "t.parquet"
    n_a = _write_shard(a, slice(0, 300))
    n_b = _write_shard(b, slice(300, read_meta(SOURCE)["num_requests"]))
    assert main(["merge", str(out), str(a), str(b)]) == 0

    source, merged = pq.read_table(SOURCE), pq.read_table(out)
    assert merged.num_rows == n_a + n_b == source.num_rows
    assert merged.column("request_id").to_pylist() == source.column("request_id").to_pylist()
    assert merged.column("feat_last").equals(source.column("feat_last"))
    assert _side(out, "decode")[0].num_rows == _side(SOURCE, "decode")[0].num_rows
    steps_src, steps = _side(SOURCE, "steps")[0], _side(out, "steps")[0]
    assert steps.num_rows == 2 * steps_src.num_rows           # each shard brought its engine steps
    assert steps.column("step_index").to_pylist() == list(range(steps.num_rows))
    runs_src = sorted(set(steps_src.column("run").to_pylist()))
    shift = max(runs_src) + 1                                   # shard b's runs come after shard a's
    assert sorted(set(steps.column("run").to_pylist())) == runs_src + [r + shift for r in runs_src]

    meta = read_meta(out)
    assert meta["num_requests"] == source.num_rows and meta["complete"] is True
    assert meta["domains"] == {"alpaca": source.num_rows}
    assert [m["file"] for m in meta["merged_from"]] == ["t-a.parquet", "t-b.parquet"]
    assert len(meta["runs"]) == 2 * len(read_meta(SOURCE)["runs"])
    assert meta["side_tables"] == {"decode": "t.decode.parquet", "steps": "t.steps.parquet"}

    from core.trace import load_trace  # the merged file passes the trace contract's validator
    trace = load_trace(out)
    assert len(trace) == source.num_rows
    np.testing.assert_array_equal(trace.output_tokens, load_trace(SOURCE).output_tokens)


def test_merge_in_place_and_partial_shards(tmp_path):
    a, b = tmp_path / "t.parquet", tmp_path / "t-b.parquet"
    _write_shard(a, slice(0, 100), {"complete": False, "planned_requests": 150})
    _write_shard(b, slice(100, 200))
    assert main(["merge", str(a), str(a), str(b)]) == 0   # output = first input
    meta = read_meta(a)
    assert meta["num_requests"] == 200 and meta["complete"] is False and meta["planned_requests"] == 250


@pytest.mark.parametrize("case", ["overlap", "settings", "missing", "one_input", "out_is_folder",
                                  "corrupt_side"])
def test_merge_bad_input_exits_2(tmp_path, capsys, case):
    a, b, out = tmp_path / "t-a.parquet", tmp_path / "t-b.parquet", tmp_path / "t.parquet"
    _write_shard(a, slice(0, 100))
    if case == "overlap":
        _write_shard(b, slice(50, 150))
    elif case == "settings":
        rc = dict(read_meta(SOURCE)["run_config"], max_tokens=2048)
        _write_shard(b, slice(100, 200), {"run_config": rc})
    elif case != "missing":
        _write_shard(b, slice(100, 200))
    if case == "out_is_folder":
        out.mkdir()
    if case == "corrupt_side":
        side_table_path(b, "steps").write_bytes(b"PAR1 truncated")
    args = ["merge", str(out), str(a)] + ([] if case == "one_input" else [str(b)])
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("capture-traces: error:"), err
    assert (out.is_dir() if case == "out_is_folder" else not out.exists())
    assert not side_table_path(out, "decode").exists() and not side_table_path(out, "steps").exists()


def test_merge_keeps_newer_step_columns(tmp_path):
    """A shard from before decode_context/probe_s merges with one that has them (nulls there)."""
    a, b, out = tmp_path / "t-a.parquet", tmp_path / "t-b.parquet", tmp_path / "t.parquet"
    _write_shard(a, slice(0, 300))
    _write_shard(b, slice(300, read_meta(SOURCE)["num_requests"]), steps_columns={
        "decode_context": lambda n: pa.array(np.arange(n), pa.int64()),
        "probe_s": lambda n: pa.array([0.001] * n, pa.float64())})
    assert main(["merge", str(out), str(a), str(b)]) == 0
    steps = _side(out, "steps")[0]
    n_a = _side(a, "steps")[0].num_rows
    ctx = steps.column("decode_context").to_pylist()
    assert ctx[:n_a] == [None] * n_a and ctx[n_a:] == list(range(steps.num_rows - n_a))
