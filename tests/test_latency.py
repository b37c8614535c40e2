"""The serving field's metrics (core/latency.py, docs/semantics.md "Metrics"): TTFT, TPOT, ITL,
E2EL against a run computed by hand, vLLM's goodput rule, ``simulate --goodput / --save-result``,
and the saved result's keys against vLLM bench serve's own."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.bench_result import committed_keys, result_keys
from core.latency import (
    describe_ms,
    gaps_from_token_times,
    good_requests,
    parse_goodput,
    request_latencies,
    weighted_describe_ms,
)
from experiments.cli import main

EIGHT = str(Path(__file__).resolve().parent.parent / "docs" / "examples" / "eight-requests.csv")
# docs/semantics.md "A run to check by hand": FCFS, one decode slot, unit steps; first tokens at t = 1
FINISH = [5, 7, 14, 1, 17, 18, 24, 29]
TOKENS = [5, 3, 8, 1, 4, 2, 7, 6]
TPOT_S = [4 / 4, 6 / 2, 13 / 7, 16 / 3, 17 / 1, 23 / 6, 28 / 5]   # (finish - 1) / (tokens - 1), row 3 left out
ENGINE = ["--trace", EIGHT, "--engine", "unit", "--arrivals", "recorded", "--decode-slots", "1", "--wait-cap", "0",
          "--quiet", "--kernel", "reference"]
HAND = [*ENGINE, "--predictor", "none"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def hand_run(tmp_path, capsys, *extra) -> dict:
    assert main([*HAND, "--json", "--out", str(tmp_path / "run"), *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_each_metric_on_the_hand_example(tmp_path, capsys):
    s = hand_run(tmp_path, capsys)
    assert s["mean_ttft_ms"] == s["p99_ttft_ms"] == 1000.0 and s["std_ttft_ms"] == 0.0
    assert s["mean_e2el_ms"] == pytest.approx(115 / 8 * 1000)
    assert s["median_e2el_ms"] == pytest.approx((14 + 17) / 2 * 1000)        # sorted: 1 5 7 14 | 17 18 24 29
    assert s["p99_e2el_ms"] == pytest.approx((24 + 0.93 * 5) * 1000)         # linear, as numpy and vLLM
    assert s["mean_tpot_ms"] == pytest.approx(sum(TPOT_S) / 7 * 1000)       # the 1-token request left out
    assert s["median_tpot_ms"] == pytest.approx(23 / 6 * 1000)
    assert s["p90_tpot_ms"] == pytest.approx((28 / 5 + 0.4 * (17 - 28 / 5)) * 1000)
    # ITL: every gap of every request pooled; the simulator takes a request's gaps at its mean gap
    assert s["mean_itl_ms"] == pytest.approx(107 / 28 * 1000)               # sum(finish - first) / sum(L - 1)
    pooled = np.repeat(TPOT_S, [t - 1 for t in TOKENS if t > 1])
    assert s["p99_itl_ms"] == pytest.approx(np.percentile(pooled, 99) * 1000)
    assert s["median_itl_ms"] == pytest.approx(np.median(pooled) * 1000)
    assert s["mean_ptl_s"] == pytest.approx(np.mean(np.array(FINISH) / TOKENS))   # NL: e2e / output tokens
    assert s["total_output_tokens"] == 36 and s["total_input_tokens"] == 80
    assert s["request_goodput"] is None                                      # no SLO given


def test_token_times_give_the_exact_gaps():
    assert gaps_from_token_times([[1.0, 2.0, 4.0], None, [3.0], [0.5, 0.75]]).tolist() == [1.0, 2.0, 0.25]
    assert describe_ms("itl", gaps_from_token_times([[0.0, 0.1, 0.3]]))["mean_itl_ms"] == pytest.approx(150.0)
    assert all(v is None for v in describe_ms("itl", gaps_from_token_times([[1.0]])).values())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 5.0, allow_nan=False), st.integers(0, 6)), min_size=1, max_size=12))
def test_weighted_statistics_equal_the_repeated_array(pairs):
    values, counts = np.array([v for v, _ in pairs]), np.array([c for _, c in pairs])
    got = weighted_describe_ms("itl", values, counts)
    want = describe_ms("itl", np.repeat(values, counts))
    for key, value in want.items():
        assert (got[key] is None) == (value is None), key
        if value is not None:
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key


def test_goodput_rule_is_vllms():
    # arrival 0; first token, finish, tokens; a one-token request has TPOT 0 for goodput
    lat = request_latencies([0, 0, 0, 0], [0.1, 0.2, 0.1, 0.5], [0.5, 1.2, 0.1, 0.9], [5, 3, 1, 2])
    assert lat["tpot"].tolist() == pytest.approx([0.1, 0.5, 0.4])
    assert good_requests(lat, {"tpot": 100}) == 2                # 0.1 s on the limit counts, one-token: 0
    assert good_requests(lat, {"ttft": 100}) == 2
    assert good_requests(lat, {"ttft": 200, "tpot": 400}) == 2   # every SLO must hold
    assert good_requests(lat, {"e2el": 900}) == 3
    assert good_requests(lat, {"e2el": 899.9}) == 2
    assert good_requests(lat, {}) == 4


def test_goodput_and_save_result_from_the_command(tmp_path, capsys):
    s = hand_run(tmp_path, capsys, "--goodput", "ttft:1000", "e2el:15000", "--save-result", str(tmp_path / "r.json"))
    assert s["request_goodput"] == pytest.approx(4 / 29)               # finishes 5, 7, 14, 1 within 15 s; over 29 s
    saved = json.loads((tmp_path / "r.json").read_text())
    assert list(saved) == sorted(result_keys())
    assert saved["request_goodput"] == s["request_goodput"] and saved["duration"] == 29.0
    assert saved["completed"] == 8 and saved["failed"] == 0 and saved["num_prompts"] == 8
    assert saved["total_token_throughput"] == pytest.approx((80 + 36) / 29)
    assert saved["p99_tpot_ms"] == s["p99_tpot_ms"] and saved["mean_itl_ms"] == s["mean_itl_ms"]
    first = (tmp_path / "r.json").read_bytes()
    assert main([*HAND, "--goodput", "tpot:3000", "--save-result", str(tmp_path / "r.json")]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "r.json").read_text())["request_goodput"] == pytest.approx(4 / 29)
    assert main([*HAND, "--goodput", "ttft:1000", "e2el:15000", "--save-result", str(tmp_path / "r.json")]) == 0
    assert (tmp_path / "r.json").read_bytes() == first                  # same run, same bytes
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["goodput"] == {"ttft": 1000.0, "e2el": 15000.0}
    table = pq.read_table(tmp_path / "run" / "results.parquet")
    assert table.column("request_goodput").to_pylist() == [pytest.approx(4 / 29)]


def test_slo_is_goodput_under_its_other_name_and_adds_attainment(tmp_path, capsys):
    s = hand_run(tmp_path, capsys, "--slo", "ttft:1000", "e2el:15000")
    assert s["request_goodput"] == pytest.approx(4 / 29)
    assert s["slo_attainment"] == pytest.approx(4 / 8)                  # 4 of the 8 completed requests
    assert hand_run(tmp_path, capsys)["slo_attainment"] is None


def test_config_rerun_keeps_its_slos(tmp_path, capsys):
    hand_run(tmp_path, capsys, "--goodput", "e2el:7000")
    assert main(["--config", str(tmp_path / "run" / "config.json"), "--json", "--kernel", "reference"]) == 0
    assert json.loads(capsys.readouterr().out)["request_goodput"] == pytest.approx(3 / 29)


def test_a_run_without_slos_keeps_its_config_bytes(tmp_path, capsys):
    hand_run(tmp_path, capsys)
    assert "goodput" not in json.loads((tmp_path / "run" / "config.json").read_text())


@pytest.mark.parametrize("extra, message", [
    (["--goodput", "tpot"], "--goodput/--slo 'tpot': expected KEY:MS"),
    (["--goodput", "itl:5"], "--goodput/--slo 'itl:5': expected KEY:MS with KEY one of ttft, tpot, e2el"),
    (["--goodput", "ttft:-1"], "--goodput/--slo 'ttft:-1': the SLO must be a finite number of ms >= 0"),
    (["--goodput", "ttft:nan"], "--goodput/--slo 'ttft:nan': the SLO must be"),
    (["--goodput", "e2el:x"], "--goodput/--slo 'e2el:x': 'x' is not a number of milliseconds"),
    (["--goodput", "ttft:1", "ttft:2"], "--goodput/--slo 'ttft:2': ttft is given twice"),
    (["--predictor", "none,oracle", "--save-result", "{tmp}/r.json"], "--save-result writes one run's result; "
     "this command plans 2 runs"),
    (["--save-result", "{tmp}"], "is a folder; name a .json file"),
])
def test_bad_metric_flags_are_one_line_and_exit_2(tmp_path, capsys, extra, message):
    args = [*(ENGINE if "--predictor" in extra else HAND), *[x.replace("{tmp}", str(tmp_path)) for x in extra]]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "r.json").exists()


def test_parse_goodput_accepts_vllms_syntax():
    assert parse_goodput(["ttft:200", "tpot:50", "e2el:1e4"]) == {"ttft": 200.0, "tpot": 50.0, "e2el": 10000.0}
    assert parse_goodput(None) == {}


def _vllm_source_keys() -> set[str] | None:
    """vLLM bench serve's result keys, read from the installed source (None without vLLM)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "benchmarks" / "serve.py"
    if not path.exists():
        return None
    src = path.read_text()
    keys = set(re.findall(r'^\s*"([a-z0-9_]+)":', src, re.M))                      # the result dict literal
    keys |= set(re.findall(r'result(?:_json)?\["([a-z0-9_]+)"\]\s*=', src))        # keys set one by one
    metrics = re.findall(r'process_one_metric\(\s*"([a-z0-9_]+)"', src)
    assert 'result[f"mean_{metric_attribute_name}_ms"]' in src and 'result[f"p{p_word}_{metric_attribute_name}_ms"]' in src
    for metric in metrics:
        keys |= {f"{stat}_{metric}_ms" for stat in ("mean", "median", "std")}
        keys |= {f"p{p}_{metric}_ms" for p in (50, 90, 99)}                     # --metric-percentiles 50,90,99
    return keys


def test_saved_keys_are_vllm_bench_serves():
    committed = committed_keys()
    assert result_keys() == committed["keys"]
    source = _vllm_source_keys()
    if source is None:   # no vLLM here: the committed list, read from vLLM's source, is the reference
        pytest.skip(f"vLLM not installed; keys held against the committed list (vLLM {committed['vllm_version']})")
    spec = importlib.util.find_spec("vllm")
    version_file = Path(spec.origin).parent / "_version.py" if spec and spec.origin else None
    found = re.search(r"version = '([^']+)'", version_file.read_text()) if version_file and version_file.exists() else None
    __version__ = found.group(1) if found else "?"
    missing = sorted(set(result_keys()) - source)
    assert not missing, f"not among vLLM {__version__} bench serve's result keys: {missing}"
    for core in ("mean_ttft_ms", "median_tpot_ms", "p99_e2el_ms", "mean_itl_ms", "request_goodput",
                 "request_throughput", "output_throughput", "total_token_throughput", "duration", "completed"):
        assert core in source and core in result_keys()


def test_leap_validate_rows_carry_the_field_figures():
    from experiments.validate import report_section
    from experiments.validate_serving import _figures

    finish, tokens = np.array(FINISH, dtype=np.float64), np.array(TOKENS, dtype=np.float64)
    row = _figures("real", finish, np.ones(8), tokens, 29.0)
    assert row["real_mean_tpot_ms"] == pytest.approx(sum(TPOT_S) / 7 * 1000)
    assert row["real_median_e2el_ms"] == pytest.approx(15500.0) and row["real_p99_ttft_ms"] == 1000.0
    assert row["real_mean_tpot_s"] * 1000 == pytest.approx(row["real_mean_tpot_ms"])   # the same rule twice
    sim = _figures("sim", finish + 1, np.ones(8), tokens, 30.0)
    line = report_section([{**row, **sim, "run": "r", "profile_from": "p", "requests": 8, "p95_e2e_err": 0.0,
                            "mean_e2e_err": 0.0, "median_abs_e2e_err": 0.0}]).splitlines()[2]
    assert f"| {row['real_p99_tpot_ms']:.0f} | {sim['sim_p99_tpot_ms']:.0f} |" in line
