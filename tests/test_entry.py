"""Console scripts: one BLAS thread by default in the command and its workers, set before numpy
loads; a value the user exported wins; a closed output pipe ends the command quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from core.patience import scaled

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

# Runs a console script's target exactly as the installed script does (``module:func()``) with
# ``--help``, then reports the thread settings the process and a freshly spawned worker see:
# the environment, and OpenBLAS's own thread count read from numpy's bundled library.
PROBE = r"""
import importlib, json, multiprocessing, os, sys

def blas_threads():
    import ctypes
    import numpy  # noqa: F401  (loads its OpenBLAS)
    libs = {line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line}
    for lib in libs:
        for sym in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads"):
            fn = getattr(ctypes.CDLL(lib), sym, None)
            if fn is not None:
                return fn()
    return None

def seen():
    return {"env": {v: os.environ.get(v) for v in %(vars)r}, "blas": blas_threads()}

if __name__ == "__main__":
    module, func = sys.argv[1].split(":")
    sys.argv = [sys.argv[2], "--help"]
    try:
        getattr(importlib.import_module(module), func)()
    except SystemExit:
        pass
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        worker = pool.apply(seen)
    print("PROBE " + json.dumps({"main": seen(), "worker": worker}))
""" % {"vars": THREAD_VARS}  # noqa: UP031 -- a template of Python code: its braces are not fields


def probe(tmp_path, name: str, env_extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env.update(env_extra or {}, PYTHONPATH=str(ROOT))
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    proc = subprocess.run([sys.executable, str(script), SCRIPTS[name], name], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=scaled(300))
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE "))
    return json.loads(line[len("PROBE "):])


def test_every_console_script_goes_through_the_entry_module():
    assert set(SCRIPTS) == {"simulate", "capture-traces", "evaluate-predictors", "leap-report", "leap-validate",
                            "leap-serve"}
    assert all(target.startswith("experiments.entry:") for target in SCRIPTS.values()), SCRIPTS


@pytest.mark.parametrize("name", ["simulate", "evaluate-predictors", "leap-report", "leap-validate"])
def test_commands_and_their_workers_run_one_blas_thread(tmp_path, name):
    seen = probe(tmp_path, name)
    for where in ("main", "worker"):
        assert seen[where]["env"] == {v: "1" for v in THREAD_VARS}, (where, seen)
        assert seen[where]["blas"] in (1, None), (where, seen)
    assert seen["main"]["blas"] == 1, seen   # numpy was loaded after the variables were set


@pytest.mark.parametrize("name", ["capture-traces", "leap-serve"])
def test_capture_traces_pins_only_numpy_blas(tmp_path, name):
    # torch's OpenMP/MKL threads stay under the command's own --threads control
    seen = probe(tmp_path, name)
    assert seen["main"]["env"] == {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": None, "MKL_NUM_THREADS": None}
    assert seen["worker"]["env"]["OPENBLAS_NUM_THREADS"] == "1"
    assert seen["main"]["blas"] == 1


def test_a_thread_count_the_user_exported_wins(tmp_path):
    seen = probe(tmp_path, "simulate", {"OPENBLAS_NUM_THREADS": "2"})
    assert seen["main"]["env"]["OPENBLAS_NUM_THREADS"] == "2"
    assert seen["worker"]["env"]["OPENBLAS_NUM_THREADS"] == "2"
    assert seen["main"]["env"]["OMP_NUM_THREADS"] == "1"


def test_closed_output_pipe_ends_quietly(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LEAP_CACHE_DIR": str(tmp_path / "cache")}
    command = (f"set -o pipefail; {sys.executable} -c 'import sys; from experiments.entry import simulate; "
               "sys.exit(simulate())' --trace sharegpt-lengths --requests 60 --predictor none,oracle "
               "--load 1x,2x --jobs 1 --json | true")
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, cwd=ROOT, timeout=scaled(300))
    assert "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr and "error" not in proc.stderr
    assert proc.returncode in (0, 141)


def test_results_do_not_depend_on_the_machine_thread_default(tmp_path):
    """ltr on the full sharegpt trace: with two OpenBLAS threads its mean PTL moves in the 6th
    digit (0.1148704 -> 0.1148715 here). Run through the entry point with the variables unset, it
    must match an explicit single-thread run on any machine (on one core both are single-threaded)."""
    def run(extra):
        env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
        env.update(extra, PYTHONPATH=str(ROOT), LEAP_CACHE_DIR=str(tmp_path / "cache"))
        proc = subprocess.run([sys.executable, "-c", "import sys; from experiments.entry import simulate; "
                               "sys.exit(simulate())", "--trace", "sharegpt", "--predictor", "ltr", "--load", "1.5x",
                               "--json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=scaled(600))
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    pinned = run({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    default = run({})
    assert {k: v for k, v in default.items() if k != "sim_cpu_s"} == {k: v for k, v in pinned.items() if k != "sim_cpu_s"}
