"""End-to-end `simulate` runs on the bundled real trace, and every bad-input case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from simulator.cli import main

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
TRACE = "sharegpt-lengths"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def run_json(capsys, *args):
    assert main(["--trace", TRACE, "--json", *args]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    return lines


REQUIRED = ["arrived", "completed", "load", "arrival_rate_req_s", "capacity_req_s", "mean_ptl_s", "mean_e2e_s",
            "p50_e2e_s", "p90_e2e_s", "p95_e2e_s", "p99_e2e_s", "mean_ttft_s", "throughput_tok_s",
            "throughput_req_s", "spearman", "kendall_tau", "predictor", "policy", "sim_cpu_s"]


def test_json_summary_has_every_field(capsys):
    [summary] = run_json(capsys, "--requests", "300", "--predictor", "oracle", "--load", "1.5x")
    for key in REQUIRED:
        assert key in summary, key
    assert summary["arrived"] == summary["completed"] == 300
    assert summary["load"] == 1.5
    assert summary["arrival_rate_req_s"] == pytest.approx(1.5 * summary["capacity_req_s"])
    assert summary["spearman"] == pytest.approx(1.0) and summary["kendall_tau"] == pytest.approx(1.0)
    assert summary["policy"] == "countdown"


def test_length_ordering_beats_fcfs_under_load(capsys):
    fcfs, oracle = run_json(capsys, "--requests", "1500", "--predictor", "none,oracle", "--load", "1.5x")
    noisy = run_json(capsys, "--requests", "1500", "--predictor", "noisy-oracle", "--noise-mae", "150",
                     "--load", "1.5x")[0]
    assert fcfs["policy"] == "fcfs" and fcfs["spearman"] is None
    assert oracle["policy"] == "countdown"
    assert oracle["mean_e2e_s"] < 0.7 * fcfs["mean_e2e_s"]
    assert oracle["mean_ptl_s"] < noisy["mean_ptl_s"] < fcfs["mean_ptl_s"]
    assert 0.5 < noisy["spearman"] < 1.0


def test_several_configurations_one_json_line_each(capsys):
    rows = run_json(capsys, "--requests", "200", "--predictor", "oracle", "--policy", "fcfs,countdown,aging",
                    "--load", "0.5x,1x")
    assert [(r["policy"], r["load"]) for r in rows] == [
        ("fcfs", 0.5), ("countdown", 0.5), ("aging", 0.5), ("fcfs", 1.0), ("countdown", 1.0), ("aging", 1.0)]


def test_out_dir_files_and_byte_identical_reruns(tmp_path):
    def args(seed, out):
        return ["--trace", TRACE, "--requests", "300", "--predictor", "noisy-oracle", "--noise-mae", "50",
                "--load", "1.2x", "--seed", str(seed), "--quiet", "--out", str(tmp_path / out)]
    assert main(args(3, "a")) == 0
    assert main(args(3, "b")) == 0
    assert main(args(4, "c")) == 0
    a, b, c = ((tmp_path / x / "requests.parquet").read_bytes() for x in "abc")
    assert a == b
    assert a != c
    table = pq.read_table(tmp_path / "a" / "requests.parquet")
    assert table.column_names == ["request_id", "arrival_s", "admit_s", "first_token_s", "finish_s",
                                  "output_tokens", "prompt_tokens", "predicted_tokens", "forced_steps"]
    assert table.num_rows == 300
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert summary["completed"] == 300
    assert config["seed"] == 3 and config["trace_name"] == TRACE and config["capacity_req_s"] > 0
    assert not list(tmp_path.glob("**/*.tmp"))
    for name in ("summary.json", "config.json"):   # result files hold no machine-measured figure
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_azure_arrivals_and_unit_engine(capsys):
    csv = SHARED / "arrivals" / "AzureLLMInferenceTrace_conv.csv"
    [s] = run_json(capsys, "--requests", "200", "--predictor", "oracle", "--arrivals", str(csv),
                   "--engine", "unit", "--decode-slots", "8", "--max-resident", "32", "--wait-cap", "0")
    assert s["completed"] == 200 and s["arrivals"].startswith(f"{csv.name}@sha256:")   # never an absolute path


def test_table_output(capsys):
    assert main(["--trace", TRACE, "--requests", "100", "--predictor", "oracle", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "mean PTL" in out and "oracle" in out and "countdown" in out


@pytest.mark.parametrize("args, message", [
    (["--load", "abc"], "--load 'abc'"),
    (["--load=-1x"], "--load '-1x'"),
    (["--load", "-1x"], "--load"),
    (["--predictor", "crystal-ball"], "unknown predictor 'crystal-ball'"),
    (["--policy", "lifo"], "unknown policy 'lifo'"),
    (["--engine", "tpu"], "unknown engine profile 'tpu'"),
    (["--trace", "/nonexistent/x.parquet"], "no such file"),
    (["--trace", "nope"], "not a file and not a bundled trace"),
    (["--decode-slots", "0"], "must be >= 1"),
    (["--requests", "ten"], "expected an integer"),
    (["--arrivals", "bursty"], "expected 'poisson', 'trace' or a .csv"),
    (["--arrivals", "trace"], "no recorded arrival_s"),
    (["--predictor", "none", "--policy", "countdown"], "needs a predictor"),
    (["--requests", "999999"], "has only"),
    (["--engine", "fitted"], "needs a steps table"),
    (["--noise-mae", "-3"], "must be a finite number >= 0"),
    (["--bogus-flag"], "unrecognized arguments"),
])
def test_bad_input_one_line_exit_2_no_output(tmp_path, args, message):
    base = ["--trace", TRACE, "--requests", "50", "--predictor", "oracle"]
    # later flags override earlier ones in argparse, so the bad value wins
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", *base, *args, "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_out_blocked_by_a_file_fails_before_any_run(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "oracle-countdown-1x-seed0").write_text("in the way")
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "--trace", TRACE, "--requests", "20",
                           "--engine", "unit", "--predictor", "none,oracle", "--load", "1x", "--jobs", "1",
                           "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "exists and is not a folder" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["oracle-countdown-1x-seed0"]   # nothing written


def test_predictor_all_with_a_length_policy_keeps_fcfs_as_the_baseline(capsys):
    rows = run_json(capsys, "--requests", "60", "--engine", "unit", "--predictor", "none,oracle,noisy-oracle",
                    "--policy", "aging,countdown", "--load", "1.5x")
    assert [(r["predictor"], r["policy"]) for r in rows] == [
        ("none", "fcfs"), ("oracle", "aging"), ("oracle", "countdown"), ("noisy-oracle", "aging"), ("noisy-oracle", "countdown")]
    assert all(r["vs_fcfs_mean_ptl_s"] is not None for r in rows)


def test_malformed_trace_file(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "--trace", str(bad), "--predictor", "oracle"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "bad.parquet" in proc.stderr and "Traceback" not in proc.stderr


def test_console_script_installed():
    # the script installed beside this interpreter (the venv's bin), not whatever PATH holds: a
    # fresh shell has no venv on PATH
    script = Path(sys.executable).parent / "simulate"
    assert script.is_file(), f"console script not installed: {script} (pip install -e .)"
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "--load" in proc.stdout


def test_sweep_writes_tidy_results_in_config_order(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["--trace", TRACE, "--requests", "200", "--predictor", "none,oracle", "--load", "1x,1.5x",
                 "--seeds", "2", "--jobs", "2", "--out", str(out), "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["seed"], r["load"], r["predictor"]) for r in rows] == [
        (s, l, p) for s in (0, 1) for l in (1.0, 1.5) for p in ("none", "oracle")]
    table = pq.read_table(out / "results.parquet")
    assert table.num_rows == 8
    assert table.column_names[:7] == ["trace", "predictor", "policy", "engine", "arrivals", "load", "seed"]
    assert (out / "results.csv").read_text().count("\n") == 9
    assert len(list(out.glob("*/requests.parquet"))) == 8
    oracle = [r for r in rows if r["predictor"] == "oracle" and r["load"] == 1.5]
    assert all(r["vs_fcfs_mean_ptl_s"] < 0 for r in oracle)
    # parallel and serial sweeps give the same figures
    assert main(["--trace", TRACE, "--requests", "200", "--predictor", "oracle", "--load", "1.5x",
                 "--seed", "1", "--jobs", "1", "--json"]) == 0
    serial = json.loads(capsys.readouterr().out)
    parallel = next(r for r in rows if r["seed"] == 1 and r["load"] == 1.5 and r["predictor"] == "oracle")
    assert serial["mean_e2e_s"] == parallel["mean_e2e_s"]


def test_ray_executor_matches_local(capsys):
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"Ray is not installed here ({exc}); `pip install 'leap-sched[ray]'` enables this test")
    args = ["--trace", TRACE, "--requests", "150", "--predictor", "none,oracle", "--load", "1.5x", "--json"]
    assert main([*args, "--executor", "ray"]) == 0
    on_ray = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert main([*args, "--jobs", "1"]) == 0
    local = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "sim_cpu_s"} for r in rows]  # noqa: E731
    assert strip(on_ray) == strip(local)


def test_plots_written_next_to_results(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is in the test extra; plots need it")
    out = tmp_path / "p"
    assert main(["--trace", TRACE, "--requests", "300", "--predictor", "none,oracle", "--load", "1x,1.5x",
                 "--out", str(out), "--plots", "--quiet"]) == 0
    for name in ("load_sweep.png", "long_requests.png", "response_cdf.png", "predicted_vs_true.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_plots_need_out(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "--trace", TRACE, "--predictor", "oracle",
                           "--plots"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--plots needs --out" in proc.stderr


def test_default_run_compares_fcfs_with_a_length_aware_predictor(capsys):
    rows = run_json(capsys, "--requests", "200")
    assert [(r["predictor"], r["policy"]) for r in rows] == [("none", "fcfs"), ("oracle", "countdown")]
    assert main(["--trace", "lmsys", "--requests", "200", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["predictor"], r["policy"]) for r in rows] == [("none", "fcfs"), ("leap-rls", "countdown")]
