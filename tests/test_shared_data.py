"""scripts/fetch_data.py and its committed hashes, offline: the files in ../shared/data match the
committed list (skipped where that folder is absent), the download path keeps only matching bytes
(file:// URLs stand in for the public hosts), and the main job's data stays bundled."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from core.io import DataDirMissing, data_dir

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fetch_data", ROOT / "scripts" / "fetch_data.py")
assert _spec is not None and _spec.loader is not None
fetch_data = sys.modules["fetch_data"] = importlib.util.module_from_spec(_spec)   # dataclasses look it up
_spec.loader.exec_module(fetch_data)


@pytest.fixture(scope="module")
def shared() -> Path:
    try:
        return data_dir()
    except DataDirMissing as exc:
        pytest.skip(f"no shared data folder here: {exc}")


def test_manifest_rows_are_unique_and_well_formed():
    entries = fetch_data.read_manifest()
    assert len({e.path for e in entries}) == len(entries) >= 20
    assert all(e.url.startswith("https://") and e.licence for e in entries)


def test_the_shared_files_match_the_committed_hashes(shared, capsys):
    assert fetch_data.main(["--check", "--dest", str(shared)]) == 0, capsys.readouterr().err
    listed = {e.path for e in fetch_data.read_manifest()}
    present = {str(p.relative_to(shared)) for p in shared.rglob("*") if p.is_file()
               and p.name not in ("README.md", "MANIFEST.tsv")}
    assert present == listed


def test_a_changed_byte_or_a_missing_file_fails_the_check(shared, tmp_path, capsys):
    entry = next(e for e in fetch_data.read_manifest() if e.path.endswith("mgsm_en.tsv"))
    copy = tmp_path / entry.path
    copy.parent.mkdir(parents=True)
    data = bytearray((shared / entry.path).read_bytes())
    data[100] ^= 1
    copy.write_bytes(bytes(data))
    assert fetch_data.problem(entry, tmp_path).startswith("sha256 ")
    assert fetch_data.main(["--check", "--dest", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{entry.path}: sha256" in err and "missing" in err


def test_download_keeps_only_matching_bytes(tmp_path):
    source = tmp_path / "upstream.csv"
    source.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n")
    good = fetch_data.Entry("arrivals/x.csv", fetch_data.sha256(source), source.stat().st_size, "copy", "CC-BY-4.0",
                            source.as_uri())
    dest = tmp_path / "data"
    assert fetch_data.fetch(good, dest) is None
    assert (dest / good.path).read_bytes() == source.read_bytes()
    moved = fetch_data.Entry("arrivals/y.csv", "0" * 64, 1, "copy", "CC-BY-4.0", source.as_uri())
    assert "differs from the committed" in fetch_data.fetch(moved, dest)
    assert sorted(p.name for p in (dest / "arrivals").iterdir()) == ["x.csv"]


def test_check_of_a_missing_folder_is_one_line_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_data.py"), "--check", "--dest",
                           str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no such folder" in done.stderr


def test_the_main_jobs_trace_is_bundled_not_fetched():
    tracked = subprocess.run(["git", "ls-files", "traces/sharegpt.parquet"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert tracked == ["traces/sharegpt.parquet"]
    assert (ROOT / "traces" / "sharegpt.parquet").read_bytes()[:4] == b"PAR1"   # Parquet, not an LFS pointer
