"""Every `simulate` flag that is given is used or refused in one line: --block-size without
--kv-blocks, --kv-blocks profile with a block too large for the profile's memory (named as typed),
and a fleet whose compiled kernel falls back notes it once, whether or not its capacity was cached."""

from __future__ import annotations

import pytest

from experiments.cli import main

TRACE = "sharegpt-lengths"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))   # empty: the capacity is measured


def one_error_line(capsys, fragment):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("simulate: error: ") and fragment in err, err


def test_block_size_without_kv_blocks_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--trace", TRACE, "--requests", "20", "--block-size", "32", "--out", str(out), "--quiet"]) == 2
    one_error_line(capsys, "--block-size 32 applies with --kv-blocks only")
    assert not out.exists()


def test_kv_blocks_profile_with_a_huge_block_names_what_was_typed(capsys):
    assert main(["--trace", TRACE, "--requests", "20", "--kv-blocks", "profile", "--block-size", "2000000000",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--kv-blocks profile --block-size 2000000000" in err and "got 0" not in err, err
    assert err.count("\n") == 1, err


def test_block_size_with_kv_blocks_reaches_the_engine(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--trace", TRACE, "--requests", "20", "--predictor", "none", "--kv-blocks", "400",
                 "--block-size", "32", "--out", str(out), "--quiet", "--kernel", "reference"]) == 0
    import json
    engine = json.loads((out / "config.json").read_text())["engine_config"]
    assert (engine["kv_blocks"], engine["kv_block_size"]) == (400, 32)


def test_a_fleet_falls_back_with_one_note_when_its_capacity_is_measured(capsys):
    from simulator.compiled import note_fallback
    note_fallback.cache_clear()
    assert main(["--trace", TRACE, "--requests", "40", "--predictor", "oracle", "--policy", "countdown", "--setting",
                 "countdown.prefill_weight=1", "--replicas", "2", "--kv-blocks", "400", "--json"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("--kernel compiled:")]
    assert notes == ["--kernel compiled: a fleet: policy 'countdown' reads the cached prompt tokens, which the kernel "
                     "does not serve a policy; --prefix-caching off runs compiled; uses the reference engine"], notes
