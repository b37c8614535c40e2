"""End-to-end `simulate` runs on the bundled real trace, and every bad-input case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from experiments.cli import main

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
                                  "admit_step", "first_token_step", "finish_step",
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
    assert "mean NL" in out and "oracle" in out and "countdown" in out


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
    (["--arrivals", "bursty"], "expected 'poisson', 'trace', 'recorded', 'closed[:N]', 'steps' or a .csv"),
    (["--arrivals", "recorded"], "trace 'sharegpt-lengths' has no recorded arrival_s"),
    (["--arrivals", "closed:0"], "closed loop needs N >= 1"),
    (["--arrivals", "closed:-3"], "closed loop needs N >= 1"),
    (["--arrivals", "closed:four"], "expected closed:N with N an integer >= 1"),
    (["--arrivals", "closed"], "trace 'sharegpt-lengths' has no recorded vLLM window"),
    (["--arrivals", "closed:4", "--load", "1x"], "--load does not apply to --arrivals closed:4"),
    (["--arrivals", "recorded", "--load", "1.5x"], "--load does not apply to --arrivals recorded"),
    (["--preset", "recorded"], "trace 'sharegpt-lengths' has no recorded vLLM engine settings"),
    (["--preset", "vllm"], "invalid choice"),
    (["--kv-budget", "100"], "max-resident 512 is above kv-budget 100"),
    (["--kv-budget", "20", "--max-resident", "4", "--decode-slots", "4"], "kv-budget 20 cannot hold request"),
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
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", *base, *args, "--out", str(tmp_path / "o")],
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
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "--trace", TRACE, "--requests", "20",
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
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "--trace", str(bad), "--predictor", "oracle"],
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
        (s, load, p) for s in (0, 1) for load in (1.0, 1.5) for p in ("none", "oracle")]
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
        pytest.skip(f"Ray is not installed here ({exc}); `pip install -e '.[ray]'` in the checkout enables this test")
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
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "--trace", TRACE, "--predictor", "oracle",
                           "--plots"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--plots needs --out" in proc.stderr


def test_default_run_compares_fcfs_with_a_length_aware_predictor(capsys):
    rows = run_json(capsys, "--requests", "200")
    assert [(r["predictor"], r["policy"]) for r in rows] == [("none", "fcfs"), ("oracle", "countdown")]
    assert main(["--trace", "lmsys", "--requests", "200", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["predictor"], r["policy"]) for r in rows] == [("none", "fcfs"), ("leap-rls", "countdown")]


# ----------------------------------------------------------------------------- replay as recorded
def write_trace(path, prompt, output, arrival=None, **meta):
    """A trace file (request ids r0, r1, ...) with optional arrival_s and recording metadata."""
    from core.trace import trace_from_arrays, trace_metadata
    trace = trace_from_arrays(path.stem, prompt, output, arrival_s=arrival)
    pq.write_table(trace.table.replace_schema_metadata(trace_metadata(**meta)), path)
    return str(path)


def vllm_meta(seqs=4, budget=64, **details):
    return {"backend": "vllm", "backend_details": {"engine_args": {"max_num_seqs": seqs, "max_num_batched_tokens": budget,
                                                                   "max_model_len": 256}, **details}}


def one_line_error(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_arrivals_recorded_replays_own_times_unscaled_ties_in_row_order(tmp_path, capsys):
    arrival = [5.0, 7.0, 7.0, 6.0, 7.0, 30.0]
    path = write_trace(tmp_path / "srv.parquet", [3, 9, 4, 5, 6, 2], [4, 3, 5, 2, 6, 3], arrival)
    out = tmp_path / "o"
    assert main(["--trace", path, "--arrivals", "recorded", "--predictor", "none", "--engine", "unit",
                 "--decode-slots", "1", "--json", "--out", str(out)]) == 0
    [summary] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert summary["load"] is None and summary["capacity_req_s"] is None and summary["arrivals"] == "recorded"
    assert summary["arrival_rate_req_s"] == pytest.approx(5 / 25.0)
    table = pq.read_table(out / "requests.parquet").to_pydict()
    # rows in (arrival, trace row) order: the three requests at t=7 keep their submission order
    assert table["request_id"] == ["r0", "r3", "r1", "r2", "r4", "r5"]
    assert table["arrival_s"] == [0.0, 1.0, 2.0, 2.0, 2.0, 25.0]
    assert not (tmp_path / "cache" / "capacity.json").exists()


def test_arrivals_recorded_batch_at_t0_works_where_rescaling_refuses(tmp_path, capsys, monkeypatch):
    """A batch recorded at t=0 (all arrival_s equal) replays as recorded; `trace` cannot stretch it."""
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    prompt, output = [30, 5, 12, 40, 8, 9, 21, 3], [20, 50, 7, 33, 12, 1, 60, 9]
    path = write_trace(tmp_path / "batch.parquet", prompt, output, [4.0] * 8)
    assert main(["--trace", path, "--arrivals", "recorded", "--predictor", "oracle", "--engine", "unit",
                 "--decode-slots", "2", "--json"]) == 0
    [summary] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert summary["completed"] == 8 and summary["arrival_rate_req_s"] is None
    assert not (tmp_path / "cache" / "capacity.json").exists()   # no capacity measured
    one_line_error(capsys, ["--trace", path, "--arrivals", "trace", "--predictor", "none", "--engine", "unit"],
                   "trace 'batch' has all arrival_s equal")

    import numpy as np

    from core.trace import load_trace
    from policies import make_policy
    from predictors.oracle import Oracle
    from simulator.engine import EngineConfig, Simulation
    from simulator.profiles import make_profile
    direct = Simulation(load_trace(path), np.zeros(8), policy=make_policy("countdown"), predictor=Oracle(),
                        profile=make_profile("unit"), config=EngineConfig(decode_slots=2)).run()
    assert summary["mean_e2e_s"] == pytest.approx(float(np.mean(direct.finish_s - direct.arrival_s)), rel=1e-12)


def test_closed_loop_keeps_n_in_flight_and_measures_no_capacity(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "o"
    assert main(["--trace", TRACE, "--requests", "120", "--arrivals", "closed:5", "--predictor", "none",
                 "--engine", "unit", "--json", "--out", str(out)]) == 0
    [summary] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert summary["arrivals"] == "closed:5" and summary["capacity_req_s"] is None and summary["completed"] == 120
    table = pq.read_table(out / "requests.parquet").to_pydict()
    arrival, finish = table["arrival_s"], table["finish_s"]
    assert arrival[:5] == [0.0] * 5 and all(a > 0 for a in arrival[5:])
    for t in sorted(set(arrival)):   # never more than 5 submitted and unfinished
        assert sum(1 for a, f in zip(arrival, finish) if a <= t < f) <= 5
    assert sorted(arrival[5:]) == sorted(finish)[:115]   # each submission is a completion
    assert json.loads((out / "config.json").read_text())["closed_loop_window"] == 5
    assert not (tmp_path / "cache" / "capacity.json").exists()


def test_preset_recorded_reads_the_recording_and_flags_override(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["--trace", "math", "--requests", "60", "--preset", "recorded", "--arrivals", "closed",
                 "--predictor", "none", "--engine", "unit", "--quiet", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["engine_config_used"] == {"max_resident": 64, "decode_slots": 64, "prefill_token_budget": 2048,
                                            "kv_token_budget": None, "wait_cap": 0, "chunked_prefill": True,
                                            "decodes_in_budget": True}
    assert config["closed_loop_window"] == 72 and config["preset"] == "recorded"
    capsys.readouterr()
    assert main(["--trace", "math", "--requests", "60", "--preset", "recorded", "--arrivals", "closed:8",
                 "--max-resident", "4", "--no-chunked-prefill", "--predictor", "none", "--engine", "unit",
                 "--quiet", "--out", str(out)]) == 0
    used = json.loads((out / "config.json").read_text())["engine_config_used"]
    assert used["max_resident"] == 4 and used["chunked_prefill"] is False and used["decode_slots"] == 64


def test_preset_whose_caps_contradict_is_refused(tmp_path, capsys):
    path = write_trace(tmp_path / "bad.parquet", [3, 4], [5, 6], None, **vllm_meta(seqs=128, budget=64))
    one_line_error(capsys, ["--trace", path, "--preset", "recorded", "--arrivals", "closed", "--predictor", "none"],
                   "max_num_batched_tokens 64 < max_num_seqs 128")
    path = write_trace(tmp_path / "kv.parquet", [3, 4], [5, 6], None, **vllm_meta(kv_blocks=1, kv_block_size=128))
    one_line_error(capsys, ["--trace", path, "--preset", "recorded", "--arrivals", "closed", "--predictor", "none"],
                   "KV cache 1 x 128 tokens < max_model_len 256")
    # a preset combined with an override the engine cannot honour
    path = write_trace(tmp_path / "ok.parquet", [3, 4], [5, 6], None, **vllm_meta())
    one_line_error(capsys, ["--trace", path, "--preset", "recorded", "--arrivals", "closed", "--predictor", "none",
                            "--kv-budget", "2"], "max-resident 4 is above kv-budget 2")


def test_arrival_csv_without_usable_timestamps_refused_before_any_output(tmp_path, capsys):
    for name, text, message in [("same.csv", "arrival_s\n3\n3\n3\n", "all timestamps are equal"),
                                ("words.csv", "TIMESTAMP\nmonday\ntuesday\n", "unparseable timestamp"),
                                ("none.csv", "when\n1\n2\n", "no TIMESTAMP or arrival_s column"),
                                ("one.csv", "arrival_s\n1\n", "needs at least two timestamps")]:
        (tmp_path / name).write_text(text)
        one_line_error(capsys, ["--trace", TRACE, "--requests", "20", "--predictor", "none", "--arrivals",
                                str(tmp_path / name), "--out", str(tmp_path / "o")], message)
        assert not (tmp_path / "o").exists()


def test_leap_validate_is_the_simulate_run_it_describes(capsys):
    """leap-validate builds its replay through the same runner as `simulate`: same figures."""
    from core.trace import load_trace
    from experiments.validate import validate_one
    row = validate_one(load_trace("math"), load_trace("lmsys"), requests=150)
    assert main(["--trace", "math", "--requests", "150", "--preset", "recorded", "--arrivals", "closed",
                 "--engine", "fitted:lmsys", "--predictor", "none", "--json"]) == 0
    [summary] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert summary["mean_e2e_s"] == pytest.approx(row["sim_mean_e2e_s"], rel=1e-12)
    assert summary["p95_e2e_s"] == pytest.approx(row["sim_p95_e2e_s"], rel=1e-12)


def test_config_file_reruns_a_run_exactly(tmp_path, capsys):
    """`simulate --config run/config.json` rebuilds the run from what it wrote: identical bytes."""
    first = tmp_path / "a"
    assert main(["--trace", "sharegpt-lengths", "--requests", "120", "--predictor", "noisy-oracle", "--noise-mae", "50",
                 "--policy", "aging", "--load", "1.5x", "--seed", "3", "--wait-cap", "16", "--out", str(first),
                 "--quiet", "--json"]) == 0
    again = tmp_path / "b"
    assert main(["--config", str(first / "config.json"), "--out", str(again), "--quiet", "--json"]) == 0
    for name in ("requests.parquet", "summary.json"):
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    capsys.readouterr()
    assert main(["--config", str(first / "config.json"), "--load", "2x"]) == 2     # nothing else may change
    assert "drop --load" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[1]")
    assert main(["--config", str(tmp_path / "bad.json")]) == 2
    assert "not a run's config.json" in capsys.readouterr().err


def test_predictor_settings_are_typed_and_refused_when_unknown(capsys):
    assert main(["--predictor", "leap", "--setting", "leap.alpah=1", "--requests", "10"]) == 2
    assert "no setting 'alpah' (its settings: alpha, cache)" in capsys.readouterr().err
    assert main(["--predictor", "tie", "--setting", "tie.queue_batch=1.5", "--requests", "10"]) == 2
    assert "expected an integer" in capsys.readouterr().err
    assert main(["--predictor", "oracle", "--setting", "tie.queue_batch=8", "--requests", "10"]) == 2
    assert "not among those run" in capsys.readouterr().err
    from predictors import PREDICTORS
    from predictors.base import PredictorOptions
    assert PREDICTORS["tie"].settings(PredictorOptions(settings={"tie": {"queue_batch": "32"}}))["queue_batch"] == 32
    assert PREDICTORS["leap"].settings(PredictorOptions(settings={"leap": {"cache": "false"}}))["cache"] is False


def test_each_run_is_prepared_and_bound_once(tmp_path, monkeypatch, capsys):
    """A 2-run sweep run in this process prepares and binds each run once (it was 4 and 6)."""
    import experiments.cli as cli
    from predictors.base import Predictor
    from simulator import runner
    counts = {"prepare": 0, "bind": 0}
    prepare, bind = runner.prepare, Predictor.bind

    def counted_prepare(*a, **k):
        counts["prepare"] += 1
        return prepare(*a, **k)

    def counted_bind(self, *a, **k):
        counts["bind"] += 1
        return bind(self, *a, **k)

    monkeypatch.setattr(cli, "prepare", counted_prepare)
    monkeypatch.setattr("experiments.sweep.prepare", counted_prepare)
    monkeypatch.setattr(Predictor, "bind", counted_bind)
    assert main(["--trace", "sharegpt-lengths", "--requests", "60", "--predictor", "oracle", "--policy",
                 "countdown,aging", "--jobs", "1", "--quiet", "--json", "--out", str(tmp_path / "s")]) == 0
    assert counts == {"prepare": 2, "bind": 2}
