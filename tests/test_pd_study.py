"""experiments.pd_study: recorded arrivals (``--arrivals FILE.csv``) and its bad input."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.pd_study import ARMS, run

ROOT = Path(__file__).resolve().parents[1]


def _args(times) -> argparse.Namespace:
    return argparse.Namespace(trace="sharegpt", prefill=1, decode=1, requests=12, load=1.3, kv_blocks=None,
                              times=None if times is None else np.asarray(times, dtype=np.float64))


def test_recorded_arrivals_reach_the_run():
    """Bursts (6 requests 1 ms apart, then a long gap) queue prompts that evenly spaced arrivals at the
    same mean rate do not: the recorded window is what the run replays."""
    arm = next(a for a in ARMS if a[1] == "round-robin" and a[2] == "fcfs")
    bursts = np.cumsum(np.tile([1e-3] * 5 + [100.0], 7))
    burst = run(arm, _args(bursts), seed=0)
    spaced = run(arm, _args(np.arange(42) * 1.0), seed=0)
    assert burst["mean_ttft_ms"] > spaced["mean_ttft_ms"]
    assert run(arm, _args(bursts), seed=0) == burst          # same seed, same figures


@pytest.mark.parametrize("argv, want", [
    (["--arrivals", "no-such-file.csv"], "--arrivals no-such-file.csv: cannot read"),
    (["--seeds", "1"], "--seeds"),
])
def test_bad_input_is_one_line_and_exit_2(argv, want, tmp_path):
    out = subprocess.run([sys.executable, "-m", "experiments.pd_study", *argv], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and want in out.stderr, out.stderr
