"""`simulate --prefill-replicas P --decode-replicas D` end to end: the hand example's files, a rerun
from config.json, --find-max-rate (deterministic, both fleets side by side), and bad input (one line
naming the flag, exit 2, nothing written)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from experiments.cli import main
from tests.test_fleet_cli import EXAMPLE

HAND = ["--trace", str(EXAMPLE), "--engine", "unit", "--arrivals", "recorded", "--decode-slots", "1",
        "--wait-cap", "0", "--quiet", "--jobs", "1", "--prefill-replicas", "1", "--decode-replicas", "2",
        "--kv-link-gbps", "0.02359296", "--kv-link-latency-ms", "500"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def test_hand_example_files_and_rerun(tmp_path):
    out = tmp_path / "run"
    assert main([*HAND, "--predictor", "none", "--out", str(out)]) == 0
    table = pq.read_table(out / "requests.parquet")
    assert table.column("decode_replica").to_pylist() == [0, 1, 0, 1, 0, 1, 0, 1]
    assert table.column("prefill_replica").to_pylist() == [0] * 8
    assert table.column("finish_s").to_pylist() == [7, 5, 14, 3, 17, 6, 23, 11]
    assert table.column("first_token_s").to_pylist() == [3] * 8   # the decode instance's first token
    assert table.column("prefill_done_s").to_pylist() == [1] * 8
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["prefill_replicas"], summary["decode_replicas"]) == (1, 2)
    assert summary["mean_ttft_ms"] == 3000 and summary["mean_kv_transfer_ms"] == 1000
    config = json.loads((out / "config.json").read_text())
    assert (config["prefill_replicas"], config["decode_replicas"], config["kv_link_latency_ms"]) == (1, 2, 500)
    again = tmp_path / "again"
    assert main(["--config", str(out / "config.json"), "--out", str(again), "--quiet"]) == 0
    assert (again / "requests.parquet").read_bytes() == (out / "requests.parquet").read_bytes()


def test_find_max_rate_prints_both_fleets_the_same_twice(capsys):
    flags = ["--trace", "sharegpt", "--requests", "60", "--prefill-replicas", "1", "--decode-replicas", "1",
             "--predictor", "none", "--slo", "ttft:300", "tpot:40", "--find-max-rate", "--json", "--quiet"]
    assert main(flags) == 0
    first = capsys.readouterr().out
    rows = [json.loads(line) for line in first.strip().splitlines()]
    assert [r["engines"] for r in rows] == [2, 2] and rows[0]["fleet"].startswith("aggregated")
    for row in rows:
        assert row["attainment_at_max"] is None or row["attainment_at_max"] >= 0.9
        failing = [load for load, attained in row["probes"] if attained < 0.9]
        if not row["capped"]:   # the bracket closed: a failing probe within the tolerance above the answer
            assert min(failing) - row["max_load"] <= 0.01 + 1e-9
    assert main(flags) == 0
    assert capsys.readouterr().out == first


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--prefill-replicas", "0", "--decode-replicas", "1"], "argument --prefill-replicas: must be >= 1"),
    (["--prefill-replicas", "1", "--decode-replicas", "-2"], "argument --decode-replicas: must be >= 1"),
    (["--prefill-replicas", "1"], "give --decode-replicas too"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link-gbps", "0"], "argument --kv-link-gbps: must be"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link-gbps", "-3"], "argument --kv-link-gbps: must be"),
    (["--decode-router", "least-kv"], "--decode-router places decodes of a prefill/decode fleet"),
    (["--replicas", "2", "--decode-router", "least-kv"], "--decode-router places decodes"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--decode-router", "least-predicted-kv",
      "--predictor", "none"], "--decode-router least-predicted-kv reads predicted KV footprints: --predictor none"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--decode-router", "least-work", "--predictor", "none"],
     "--decode-router least-work reads predicted work"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--decode-router", "nope"], "unknown --decode-router"),
    (["--replicas", "2", "--router", "least-kv"], "--router least-kv places requests after prefill only"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--find-max-rate"], "--find-max-rate needs --slo"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--replicas", "2"], "--replicas is an aggregated fleet"),
    (["--kv-link-gbps", "10"], "--kv-link-gbps is the KV link of a prefill/decode fleet"),
])
def test_bad_pd_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, flags, fragment):
    out = tmp_path / "out"
    base = ["--trace", str(EXAMPLE), "--engine", "unit", "--arrivals", "recorded", "--quiet"]
    assert main([*base, *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("simulate: error: ") and fragment in err, err
    assert not out.exists()
