"""Tests that assert meaning with hand-computed or literal values, not only that something moved:
the summary metrics on a workload small enough to trace by hand, TIE's CVaR level, the default
engine profile at fixed points, and the engine's progress check."""

from __future__ import annotations

import numpy as np
import pytest

from core.trace import trace_from_arrays
from policies.fcfs import FCFS
from simulator.engine import EngineConfig, Simulation, SimulationStalled
from simulator.metrics import summarize
from simulator.profiles import make_profile
from simulator.profiles.roofline import RooflineProfile
from simulator.profiles.unit import UnitProfile


def hand_run():
    """Three one-token prompts of 3, 1 and 2 output tokens (A, B, C), all at t = 0; one decode
    slot, 1 s steps, FCFS, no wait cap. By hand:
      step 0 [0,1): prefill A, B, C -> first tokens at 1; B (1 token) finishes at 1
      step 1 [1,2): decode A (2 tokens); step 2 [2,3): A finishes at 3; step 3 [3,4): C at 4
    e2e A 3, B 1, C 4; PTL = e2e / output tokens = 1, 1, 2; TTFT 1 each;
    TPOT = (finish - first token) / (tokens - 1) = A 1, C 3."""
    trace = trace_from_arrays("hand", [1, 1, 1], [3, 1, 2])
    sim = Simulation(trace, np.zeros(3), policy=FCFS(), predictor=None, profile=UnitProfile(),
                     config=EngineConfig(decode_slots=1, wait_cap=0))
    return sim.run()


def test_summary_metrics_by_hand():
    s = summarize(hand_run())
    assert s["arrived"] == 3 and s["completed"] == 3
    assert s["mean_ptl_s"] == pytest.approx(4 / 3)      # not e2e: that would be 8/3
    assert s["mean_e2e_s"] == pytest.approx(8 / 3)
    # percentiles of e2e [1, 3, 4], linear interpolation between order statistics
    assert s["p50_e2e_s"] == pytest.approx(3.0)
    assert s["p90_e2e_s"] == pytest.approx(3.8)
    assert s["p95_e2e_s"] == pytest.approx(3.9)          # not p90's 3.8
    assert s["p99_e2e_s"] == pytest.approx(3.98)
    assert s["mean_ttft_s"] == pytest.approx(1.0)
    assert s["p95_ttft_s"] == pytest.approx(1.0)
    assert s["mean_tpot_s"] == pytest.approx(2.0)
    # longest decile: output tokens >= their 90th percentile (2.8) -> A alone
    assert s["long_decile_mean_e2e_s"] == pytest.approx(3.0)
    assert s["over1024_requests"] == 0 and s["over1024_mean_e2e_s"] is None
    assert s["makespan_s"] == pytest.approx(4.0)
    assert s["throughput_tok_s"] == pytest.approx(6 / 4)
    assert s["throughput_req_s"] == pytest.approx(3 / 4)
    assert s["steps"] == 4 and s["forced_steps"] == 0
    # steps 1 and 2 had two ready requests for one slot; steps 0 and 3 had no choice
    assert s["saturated_share"] == pytest.approx(0.5)


def test_tie_cvar_is_the_top_decile_mean():
    """CVaR_0.9 of min(X, 2048) is the mean of the top 10% of min(X, 2048), X = exp(mu + sigma T),
    T ~ Student t with 3.5 degrees of freedom (spec: baselines.md); every level written out here."""
    from predictors.tie import tie_terms

    mu, sigma = 5.0, 1.2
    t = np.sort(np.random.default_rng(3).standard_t(3.5, size=4_000_000))
    x = np.exp(mu + sigma * t)
    expected_mean = np.minimum(x, 2028.0).mean()
    expected_cvar = np.minimum(x, 2048.0)[int(0.9 * len(x)):].mean()
    e, c = tie_terms(mu, sigma)
    assert e[0] == pytest.approx(expected_mean, rel=5e-3)
    assert c[0] == pytest.approx(expected_cvar, rel=5e-3)
    # a level of 0.8 or 0.95 would move it well outside that tolerance
    assert abs(np.minimum(x, 2048.0)[int(0.8 * len(x)):].mean() / expected_cvar - 1) > 0.05
    assert abs(np.minimum(x, 2048.0)[int(0.95 * len(x)):].mean() / expected_cvar - 1) > 0.05


# step_time(prefill tokens, sum of squared prompt lengths, decode batch, decode context tokens)
DEFAULT_PROFILE_POINTS = [
    ((0, 0, 1, 100), 0.011560999891690231),               # one decode: weights over HBM
    ((0, 0, 64, 64 * 1000), 0.015699006588203945),        # full decode batch, KV reads
    ((2048, 2048 ** 2, 0, 0), 0.05244363140119913),       # prefill: compute bound
    ((512, 512 ** 2, 64, 64 * 500), 0.02054650897670309),  # mixed step
]


@pytest.mark.parametrize("args,seconds", DEFAULT_PROFILE_POINTS)
def test_default_profile_is_pinned(args, seconds):
    assert make_profile("qwen3-8b-h100").step_time(*args) == pytest.approx(seconds, rel=1e-6)


@pytest.mark.parametrize("change", [{"hbm_efficiency": 0.70 * 1.05}, {"flop_efficiency": 0.64 * 1.05}])
def test_a_five_percent_efficiency_change_moves_the_pinned_points(change):
    from core import hardware

    default = make_profile("qwen3-8b-h100")
    assert isinstance(default, RooflineProfile)
    assert (hardware.HBM_EFFICIENCY, hardware.FLOP_EFFICIENCY) == (0.70, 0.64)
    changed = RooflineProfile(default.model, default.gpu, eager=default.eager, **change)
    moved = [abs(changed.step_time(*a) / s - 1) > 1e-6 for a, s in DEFAULT_PROFILE_POINTS]
    assert any(moved)


@pytest.mark.timeout(20)
def test_engine_stops_on_a_step_that_makes_no_progress():
    trace = trace_from_arrays("stall", [1, 1], [5, 5])
    config = EngineConfig(decode_slots=1)
    object.__setattr__(config, "decode_slots", 0)   # a bug elsewhere; validation would refuse it
    sim = Simulation(trace, np.zeros(2), policy=FCFS(), predictor=None, profile=UnitProfile(), config=config)
    with pytest.raises(SimulationStalled, match=r"step 1 .* admitted and decoded nothing with 2 resident"):
        sim.run()
