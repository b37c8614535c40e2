"""No process outlives its output: ``simulate`` with a predictor that learns online (its feedback
runs between the engine's steps, and its updates publish as events after the last one) exits once
its table is printed, on both kernels. Each run is a subprocess, so a hang at interpreter exit
(after the table) shows as a timeout here rather than as a test that passes in-process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from predictors import PREDICTORS
from simulator.compiled import KERNELS

ROOT = Path(__file__).resolve().parents[1]
#: Only bounds a hang: a run takes seconds (plus numba's compile on the compiled kernel), even on
#: a loaded machine far less than this.
HUNG_S = 600
ONLINE = [name for name, cls in PREDICTORS.items() if cls.learns_online]


def test_online_learners_are_found():
    assert "leap-rls" in ONLINE


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("predictor", ONLINE)
def test_simulate_with_an_online_learner_exits_after_its_table(tmp_path_factory, kernel, predictor):
    if kernel == "compiled" and importlib.util.find_spec("numba") is None:
        pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back")
    env = dict(os.environ, LEAP_CACHE_DIR=str(tmp_path_factory.getbasetemp() / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("COLUMNS", None)
    proc = subprocess.Popen([sys.executable, "-m", "experiments.cli", "--trace", "math", "--requests", "200",
                             "--predictor", predictor, "--kernel", kernel, "--quiet"], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=HUNG_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"simulate --predictor {predictor} --kernel {kernel} did not exit within {HUNG_S} s; "
                    f"printed so far:\n{out}{err}")
    assert proc.returncode == 0, err
    assert f" {predictor} " in out and "200 requests" in out
    assert "uses the reference engine" not in err   # the compiled kernel ran it
