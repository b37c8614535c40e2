"""What a new user meets after the first command (issue 32's smaller items): the first compile is
announced in one short line, a fallback note is said once, ``--decode-slots`` above the resident
cap is refused as the live scheduler refuses it, and a ``--config`` type error names its key."""

from __future__ import annotations

import json
import multiprocessing
import sys

import pytest

from experiments.cli import main as simulate
from simulator import compiled, kernel


@pytest.fixture
def fresh_notes():
    kernel.announce_compile.cache_clear()
    compiled.note_fallback.cache_clear()
    yield
    kernel.announce_compile.cache_clear()
    compiled.note_fallback.cache_clear()


def test_first_compile_is_announced_once_in_one_short_line(tmp_path, monkeypatch, capsys, fresh_notes):
    pytest.importorskip("numba")
    monkeypatch.setattr(kernel, "numba_cache_folder", lambda: str(tmp_path))
    kernel.announce_compile()
    assert capsys.readouterr().err == ""   # not a terminal: logs and pipes stay as they were
    kernel.announce_compile.cache_clear()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    kernel.announce_compile()
    kernel.announce_compile()
    err = capsys.readouterr().err
    assert err == kernel.COMPILE_NOTE + "\n" and len(kernel.COMPILE_NOTE) <= 79


def test_no_compile_note_when_cached_or_in_a_worker(tmp_path, monkeypatch, capsys, fresh_notes):
    monkeypatch.setattr(kernel, "numba_cache_folder", lambda: str(tmp_path))
    (tmp_path / "simulator_x").mkdir()
    (tmp_path / "simulator_x" / "kernel._run_steps-98.py311.nbi").write_bytes(b"")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    kernel.announce_compile()
    (tmp_path / "simulator_x" / "kernel._run_steps-98.py311.nbi").unlink()
    kernel.announce_compile.cache_clear()
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())   # as in a sweep's worker
    kernel.announce_compile()
    assert capsys.readouterr().err == ""


def test_fallback_note_fits_79_columns_and_workers_of_a_noted_command_stay_quiet(monkeypatch, capsys,
                                                                                 fresh_notes):
    monkeypatch.setattr(compiled, "load_kernel", lambda: None)
    reason = compiled.unsupported(None)
    compiled.note_fallback(reason)
    line = capsys.readouterr().err.rstrip("\n")
    assert line.endswith("uses the reference engine") and len(line) <= 79
    compiled.note_fallback.cache_clear()
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    monkeypatch.setenv(compiled.NOTED_ENV, "1")   # simulate said it before starting its workers
    compiled.note_fallback(reason)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("args", [["--decode-slots", "600"], ["--decode-slots", "9", "--max-resident", "8"],
                                  ["--max-resident", "32"]])
def test_decode_slots_above_the_resident_cap_are_refused_like_live(args, tmp_path, capsys):
    out = tmp_path / "out"
    assert simulate(["--trace", "sharegpt-lengths", "--requests", "50", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot exceed max-resident" in err and "decode-slots (" in err
    assert not out.exists()


def test_live_config_uses_the_same_rule():
    from live.common import LiveConfigError
    from live.config import LiveSchedulerConfig

    with pytest.raises(LiveConfigError, match=r"decode-slots \(9\) cannot exceed max-resident \(8\)"):
        LiveSchedulerConfig(max_resident=8, decode_slots=9)


@pytest.mark.parametrize("key, value", [("seed", "x"), ("load", "x"), ("requests", "x"), ("tile", 2.5)])
def test_config_type_error_names_its_key(key, value, tmp_path, capsys):
    out = tmp_path / "run"
    assert simulate(["--trace", "sharegpt-lengths", "--requests", "40", "--predictor", "oracle", "--load", "1x",
                     "--quiet", "--out", str(out)]) == 0
    record = json.loads((out / "config.json").read_text())
    record[key] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(record))
    capsys.readouterr()
    assert simulate(["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"key {key!r} must be" in err, err
