"""``leap-serve --clock steps --replicas N --router NAME`` (live/fleet.py, docs/semantics.md "Live
fleets"): engines in one process, stepped in lockstep, arrivals routed by ``routers/``.

The served run needs the capture venv and the local SmolLM2 checkpoint, and skips with the reason
otherwise: two engine starts, 10 short requests (about a minute). The bad-input cases exit before
any engine starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from core.patience import scaled
from tests.test_stepclock_live import (
    CPU,
    HAVE_MODEL,
    MODEL,
    ROOT,
    SOURCE,
    _csv,
    _env,
    needs_engine,
    refused_before_the_engine,
)

#: a burst at 0, stragglers, and two arrivals long after the first ones finished (idle ticks)
ARRIVALS = [0, 0, 0, 1, 2, 5, 5, 9, 60, 60]


@pytest.mark.skipif(not HAVE_MODEL, reason=f"needs the model directory at {MODEL} (the flags are checked "
                                           "after the model argument is parsed)")
@pytest.mark.parametrize("case", ["seconds_clock", "unknown_router", "no_router_estimate", "zero", "too_many",
                                  "server", "measure", "cache_router", "engine_scored_estimate"])
def test_bad_fleet_input_exits_2_before_the_engine(tmp_path, case, monkeypatch, capsys):
    out = tmp_path / "o.parquet"
    base = ["--model", str(MODEL), "--from", str(SOURCE), "--requests", "4", "--out", str(out),
            "--arrivals", "poisson", "--load", "1x", "--capacity", "0.1"]
    steps = ["--clock", "steps"]
    args, named = {
        "seconds_clock": (["--replicas", "2"], "--clock steps"),
        "unknown_router": ([*steps, "--replicas", "2", "--router", "nearest"], "--router 'nearest'"),
        "no_router_estimate": ([*steps, "--replicas", "2", "--router", "least-work"], "--predictor none"),
        "zero": ([*steps, "--replicas", "0"], "--replicas"),
        "too_many": ([*steps, "--replicas", str(10**9)], "--replicas"),
        "server": ([*steps, "--replicas", "2", "--server", "http://127.0.0.1:9"], "--server"),
        "measure": ([*steps, "--replicas", "2", "--capacity", "measure"], "--capacity measure"),
        "cache_router": ([*steps, "--replicas", "2", "--router", "weighted"], "--router weighted"),
        # ssjf serves the simulator's least-work from the prompt, but live its score is the engine's
        "engine_scored_estimate": ([*steps, "--replicas", "2", "--router", "least-work", "--predictor", "ssjf"],
                                   "--predictor ssjf: a live fleet routes before any engine scores"),
    }[case]
    refused_before_the_engine([*base, *args], named, out, tmp_path, monkeypatch, capsys)


@pytest.mark.capture
@needs_engine
@pytest.mark.parametrize("router", ["least-requests"])
def test_two_engine_fleet_equals_its_simulation(tmp_path, router):
    """Two engines, 2 resident and 1 decode slot each: requests queue on both replicas, the router
    reads the live outstanding counts, and the replay (``simulate --arrivals steps --replicas 2``)
    routes every request to the same replica and admits, starts and finishes it at the same step."""
    import pyarrow.parquet as pq

    from core.trace import load_trace
    from experiments.validate_steps import validate_step_run

    out = tmp_path / "fleet.parquet"
    r = subprocess.run([sys.executable, "-m", "live.serve", "--model", str(MODEL), "--from", str(SOURCE),
                        "--requests", str(len(ARRIVALS)), "--force-lengths", "--max-length", "12",
                        "--max-resident", "2", "--decode-slots", "1", "--kv-space-gib", "1",
                        "--threads", CPU, "--clock", "steps", "--arrivals", _csv(tmp_path, ARRIVALS),
                        "--replicas", "2", "--router", router, "--out", str(out)],
                       cwd=ROOT, env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=scaled(900))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = pq.read_table(out).to_pylist()
    assert sorted({x["replica"] for x in rows}) == [0, 1]
    assert [x["replica"] for x in rows[:2]] == [0, 1]          # the first two: an empty fleet, ties to 0
    meta = load_trace(out).metadata
    assert meta["serving"]["replicas"] == 2 and meta["serving"]["router"] == router
    row = validate_step_run(load_trace(out), kernel="reference")   # no numba in this process: later in-process engines (conftest)
    assert row["replica_match_share"] == 1.0
    for name in ("admit_step", "first_token_step", "finish_step"):
        assert row[f"{name}_match_share"] == 1.0, row["finish_step_mismatches"]
