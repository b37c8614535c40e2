"""Where a serving run's LEAP read-out is found (experiments/live_replay.readout_file): beside the
run or in the folder above it (repeats kept in a subfolder share one read-out), always by hash."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

from experiments.live_replay import readout_file


def _run(path, ref):
    return SimpleNamespace(name=path.stem, path=path, metadata={"serving": {"readout": ref}})


def test_readout_beside_the_run_or_one_folder_up_checked_by_hash(tmp_path):
    blob = b"not really a read-out"
    ref = f"r.npz@sha256:{hashlib.sha256(blob).hexdigest()[:16]}"
    (tmp_path / "r.npz").write_bytes(blob)
    (tmp_path / "repeats").mkdir()
    for run in (tmp_path / "a.parquet", tmp_path / "repeats" / "b.parquet"):
        path, why = readout_file(_run(run, ref))
        assert path == tmp_path / "r.npz" and why == ""
    path, why = readout_file(_run(tmp_path / "repeats" / "b.parquet", "r.npz@sha256:0000000000000000"))
    assert path is None and "hash" in why
    path, why = readout_file(_run(tmp_path / "repeats" / "deeper" / "c.parquet", ref))
    assert path is None and "not found" in why
