"""Nothing machine-specific in shared outputs or committed traces, and a trace's content hash (which
keys shipped weights and fit caches) ignores its provenance metadata and file encoding."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.io import shareable_path
from core.trace import METADATA_KEY, load_trace, trace_content_hash, trace_reference, traces_dir
from experiments.cli import main

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _copy_trace(out: Path, meta_update: dict) -> Path:
    src = traces_dir() / "sharegpt-lengths.parquet"
    table = pq.read_table(src)
    meta = {**json.loads(table.schema.metadata[METADATA_KEY]), **meta_update}
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()}), out,
                   compression="gzip", row_group_size=1000)
    return out


def test_content_hash_ignores_provenance_and_encoding(tmp_path):
    original = load_trace("sharegpt-lengths")
    copy = load_trace(_copy_trace(tmp_path / "a.parquet", {"host": "elsewhere", "capture_date": "2030-01-01",
                                             "model_path": "/some/where"}))
    assert copy.content_hash == original.content_hash
    assert load_trace(_copy_trace(tmp_path / "b.parquet", {"model_id": "other/model"})).content_hash != original.content_hash
    table = original.table
    changed = table.set_column(table.column_names.index("output_tokens"), "output_tokens",
                               pa.array(np.r_[table.column("output_tokens").to_numpy()[:-1] + 0, 1], pa.int32()))
    assert trace_content_hash(changed, original.metadata) != original.content_hash


def test_config_and_results_name_inputs_without_absolute_paths(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    trace_copy = elsewhere / "mine.parquet"
    shutil.copy(traces_dir() / "sharegpt-lengths.parquet", trace_copy)
    csv = elsewhere / "arrivals.csv"
    csv.write_text("TIMESTAMP\n" + "".join(f"{0.5 * i}\n" for i in range(50)))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out = work / "runs"
    assert main(["--trace", str(trace_copy), "--arrivals", str(csv), "--requests", "50", "--predictor",
                 "none,oracle", "--train-trace", str(trace_copy), "--quiet", "--out", str(out)]) == 0
    texts = [p.read_text() for p in out.rglob("*.json")] + [(out / "results.csv").read_text()]
    for text in texts:
        assert str(tmp_path) not in text and "/work/" not in text and "/root/" not in text
    config = json.loads(next(out.rglob("config.json")).read_text())
    assert config["trace"].startswith("mine.parquet@sha256:") and config["trace_path"] == config["trace"]
    assert config["arrivals"].startswith("arrivals.csv@sha256:")
    # inside the current folder: a relative path; a bundled trace: its name
    assert shareable_path(trace_copy) == config["trace"]
    local = work / "local.parquet"
    shutil.copy(trace_copy, local)
    assert trace_reference(str(local)) == "local.parquet"
    assert trace_reference(str(traces_dir() / "sharegpt-lengths.parquet")) == "sharegpt-lengths"
    assert trace_reference("sharegpt-lengths") == "sharegpt-lengths"


def test_committed_traces_hold_no_local_paths_or_host_names():
    host = os.uname().nodename
    for path in sorted([*traces_dir().glob("*.parquet"), *traces_dir().glob("live/*.parquet")]):
        meta = pq.read_schema(path).metadata[METADATA_KEY].decode()
        assert "model_path" not in json.loads(meta), path.name
        for needle in ("/root/", "/home/", "/work/", f'"{host};', f'"host": "{host}'):
            assert needle not in meta, f"{path.name}: {needle}"
