"""Every benchmark runs as documented (a tiny configuration here, so that they cannot rot)."""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from core.patience import scaled
from core.trace import bundled_trace_names, load_trace, trace_from_arrays, trace_metadata

ROOT = Path(__file__).resolve().parents[1]


def bench_env(tmp_path):
    return {**os.environ, "PYTHONPATH": str(ROOT), "LEAP_CACHE_DIR": str(tmp_path / "cache")}


def load_bench_simulator():
    spec = importlib.util.spec_from_file_location("bench_simulator", ROOT / "benchmarks" / "bench_simulator.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_simulator_tiles_a_short_default_trace(tmp_path):
    # the documented default: 4,000 requests of the default trace, which has fewer (1,595)
    bench = load_bench_simulator()
    default = next(t for t in ("sharegpt", "sharegpt-lengths") if t in bundled_trace_names())
    source = load_trace(default)
    path, n = bench.tiled_trace(default, 4000, tmp_path)
    tiled = load_trace(path)
    assert n == len(source) and len(tiled) == 4000 and len(set(tiled.request_id)) == 4000
    counts = collections.Counter(rid.rsplit("#", 1)[0] for rid in tiled.request_id)
    assert set(counts) <= set(source.request_id) and set(counts.values()) <= {4000 // n, 4000 // n + 1}
    (tmp_path / "again").mkdir()
    again = load_trace(bench.tiled_trace(default, 4000, tmp_path / "again")[0])
    assert list(again.request_id) == list(tiled.request_id)   # same arguments, same requests
    assert bench.tiled_trace(default, 100, tmp_path) == (default, n)   # enough requests: the trace itself


def test_bench_simulator_runs(tmp_path):
    trace = trace_from_arrays("tiny", [20] * 40, list(range(2, 42)))
    path = tmp_path / "tiny.parquet"
    pq.write_table(trace.table.replace_schema_metadata(trace_metadata()), path)
    # the start-up on the suite's numba cache: an empty one would compile the kernel once more (~60 CPU-s)
    warm = ["--startup-cache", os.environ["NUMBA_CACHE_DIR"]] if os.environ.get("NUMBA_CACHE_DIR") else []
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_simulator.py"), "--trace", str(path),
                           "--requests", "150", "--repeat", "1", "--scale", "300,600", *warm], capture_output=True,
                          text=True, env=bench_env(tmp_path), cwd=tmp_path, timeout=scaled(600))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "150 requests (tiled from 40)" in proc.stdout
    assert proc.stdout.count("requests/CPU-s") == 6   # 3 cases x (reference, compiled)
    assert proc.stdout.count("identical finish times") == 3
    if "compiled kernel unavailable" not in proc.stdout:   # prepare against the loop at each --scale size
        # each size at each of the default loads (1x, 0.8x), then the flatness over the sizes per load
        assert proc.stdout.count("prepare vs loop") == 2 and proc.stdout.count("us in all") == 4
        assert proc.stdout.count("largest / smallest over the sizes") == 2 and "steps per request" in proc.stdout
        assert "per-pair coverage" in proc.stdout   # how many predictor x policy pairs run compiled
    if "compiled kernel start-up" in proc.stdout:   # with numba: the second process loads the cached kernel
        line = next(x for x in proc.stdout.splitlines() if "compiled kernel start-up" in x)
        assert "first process" in line and "second" in line and "failed" not in line, line


def test_bench_leap_runs(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_leap.py"), "--d", "64", "--n", "2000",
                           "--quick", "--json"], capture_output=True, text=True,
                          env=bench_env(tmp_path), cwd=tmp_path, timeout=scaled(600))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert isinstance(json.loads(proc.stdout), dict)


def test_bench_leap_breakdown_runs(tmp_path):
    # a slice of the recorded trace (leap reads its hidden states); numba's cache as the other kernel tests use it
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_leap_breakdown.py"), "--requests", "120",
                           "--repeat", "1"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=scaled(600))
    assert proc.returncode == 0, proc.stderr[-2000:]
    if "compiled kernel unavailable" in proc.stdout:
        return
    assert proc.stdout.count("req/CPU-s") == 4   # oracle, leap and the two what-if replays
    assert "publishes in compiled code" in proc.stdout and "steps with forced rows" in proc.stdout
    assert "leap and its fixed-estimates replay: identical finish times" in proc.stdout


def test_bench_leap_breakdown_refuses_a_trace_without_hidden_states(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_leap_breakdown.py"), "--trace",
                           "sharegpt-lengths", "--repeat", "1"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, timeout=scaled(600))
    if "compiled kernel unavailable" in proc.stdout:
        return
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert proc.stdout == "" and "feat_last" in proc.stderr   # refused before any run
    assert "Traceback" not in proc.stderr


def test_bench_fleet_prints_its_table_rows(tmp_path):
    """Every row a Markdown table row of 9 cells, measured in its own child process; the single engine
    is the reference ratio of the cost-per-request rows (1.0x at 1 replica)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fleet.py"), "--big", "60", "--per-replica",
                           "8", "--sizes", "1,2", "--kv-requests", "40"], capture_output=True, text=True,
                          env=bench_env(tmp_path), cwd=tmp_path, timeout=scaled(900))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and not line.startswith("| row ")]
    assert len(rows) == 8 and all(len(row.split("|")) == 11 for row in rows), proc.stdout
    cells = {row.split("|")[1].strip(): [c.strip() for c in row.split("|")[2:-1]] for row in rows}
    assert cells["16 replicas, FCFS + least-requests"][0] == "60"
    assert cells["1 replica x 8, FCFS + least-requests (single engine)"][6] == "1.0x"
    assert cells["2 replicas x 8, FCFS + least-requests"][0] == "16"
    assert cells["16 replicas, countdown + leap + least-work"][-1].startswith(">= 60k req/CPU-s: ")
    assert "within 1.5x of off" in cells["16 replicas, KV blocks on (ratio: x KV off)"][-1]
    assert "loadavg" in proc.stdout.splitlines()[0] and "loadavg" in proc.stdout.splitlines()[-1]


def test_bench_fleet_refuses_sizes_without_the_single_engine(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fleet.py"), "--sizes", "2,4"],
                          capture_output=True, text=True, env=bench_env(tmp_path), cwd=tmp_path, timeout=scaled(120))
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert "--sizes 2,4" in proc.stderr and "Traceback" not in proc.stderr
