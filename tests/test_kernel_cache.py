"""The compiled kernel is cached across processes (numba's cache): a second process loads what the
first compiled, runs it (a recursive helper in the kernel used to segfault here, numba#6061) and
gets the same bytes as the first and as the reference engine."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.patience import scaled

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba is not installed (extra `fast`): no compiled kernel to cache")
# 200 decode slots at 2x: steps decode more than 128 rows, so the kernel's pairwise sum walks its stack
RUN = ("import sys, time\n"
       "from simulator.engine import EngineConfig\n"
       "from simulator.runner import RunConfig, prepare, execute\n"
       "p = prepare(RunConfig(trace='sharegpt-lengths', predictor='oracle', policy='countdown', load=2.0, "
       "requests=400, engine_config=EngineConfig(decode_slots=200), kernel=sys.argv[1]))\n"
       "t = time.process_time(); s, r = execute(p); spent = time.process_time() - t\n"
       "sys.stdout.buffer.write(r.finish_s.tobytes()); print(spent, file=sys.stderr)\n")


def test_second_process_loads_the_cached_kernel_and_gets_the_same_bytes(tmp_path):
    numba_cache = tmp_path / "numba"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(numba_cache), LEAP_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    runs = []
    for kernel in ("compiled", "compiled", "reference"):
        proc = subprocess.run([sys.executable, "-c", RUN, kernel], env=env, capture_output=True, timeout=scaled(900),
                              check=False)
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        runs.append(proc)
        if len(runs) == 1:   # the first process compiled and wrote the kernel's cache
            assert list(numba_cache.rglob("*_run_steps*.nbi")), sorted(p.name for p in numba_cache.rglob("*"))
    assert runs[0].stdout == runs[1].stdout == runs[2].stdout and len(runs[0].stdout) == 8 * 400
