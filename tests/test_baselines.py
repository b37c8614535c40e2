"""The trained baselines (TIE, SSJF, LTR, TRAIL, EGTP) and their scheduler-side policies.

Training tests need torch (optional extra ``train``) and are skipped without it; inference, the
TIE score, TRAIL's smoothing and the policies are numpy only. Each predictor is trained on a small
synthetic trace written to disk (always) and on a slice of the recorded ``traces/lmsys.parquet``
(skipped if it is absent), and must beat a constant predictor on held-out Spearman (LTR: Kendall
tau) -- a constant has no rank correlation, so "beats" means a clearly positive correlation.
Here: training, weights, costs and runs through the simulator; TIE's score and TRAIL:
tests/test_baseline_scores.py; the starvation and preemption policies: tests/test_baseline_policies.py;
the shared parts: tests/baseline_cases.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import baseline_cases  # noqa: E402
import numpy as np
import pytest
from baseline_cases import (  # noqa: E402, F401
    BASELINES,
    FAST,
    HAVE_TORCH,
    LMSYS,
    POLICY_OF,
    _check_invariants,
    held_out,
    needs_torch,
    predictor_class,
    split_rows,
    untrained_trail,
)

from core.patience import scaled
from core.trace import load_trace
from policies import make_policy
from predictors import make_predictor
from predictors.base import PredictorOptions
from simulator.capacity import measure_capacity
from simulator.engine import EngineConfig, Simulation
from simulator.profiles import make_profile
from simulator.workload import ArrivalSpec, make_arrivals

# the shared fixtures, with their scopes
synth_path = baseline_cases.synth_path
_private_cache = baseline_cases._private_cache
synth_trained = baseline_cases.synth_trained
synth_test = baseline_cases.synth_test
synth_predictors = baseline_cases.synth_predictors


# ----------------------------------------------------------------------------- training quality
@pytest.mark.parametrize("name", BASELINES)
def test_trains_on_synthetic_and_beats_constant(name, synth_trained):
    predictors, test = synth_trained
    q = held_out(name, predictors[name], test)
    assert q > 0.5, f"{name}: held-out rank correlation {q:.3f}"
    meta = predictors[name].artifact.meta
    assert meta["train_seconds"] < 30


@needs_torch
@pytest.mark.skipif(not LMSYS.is_file(), reason="traces/lmsys.parquet not recorded yet")
@pytest.mark.parametrize("name", BASELINES)
def test_trains_on_lmsys_slice_and_beats_constant(name):
    trace = load_trace(LMSYS)
    train_rows, test_rows = split_rows(len(trace))
    predictor = predictor_class(name).fit(trace.take(train_rows), **FAST)
    # the training time is recorded (a positive duration), not raced against a wall-clock bound
    assert predictor.artifact.meta["train_seconds"] > 0
    q = held_out(name, predictor, trace.take(test_rows))
    assert q > 0.05, f"{name}: held-out rank correlation {q:.3f} on lmsys (a constant has none)"


# ----------------------------------------------------------------------------- weights
@needs_torch
def test_training_is_cached_and_deterministic(synth_path):
    options = PredictorOptions(train_trace=str(synth_path), settings={"ssjf": dict(FAST)})
    first = make_predictor("ssjf", options)
    assert first.artifact.source == "trained"
    again = make_predictor("ssjf", options)
    assert again.artifact.source == "cache"
    retrained = make_predictor("ssjf", PredictorOptions(train_trace=str(synth_path), settings={"ssjf": {**FAST, "retrain": True}}))
    for key, value in first.artifact.arrays.items():
        np.testing.assert_array_equal(value, retrained.artifact.arrays[key])


def test_missing_torch_fails_with_one_clear_message(synth_path, monkeypatch):
    import predictors.heads as heads
    from predictors.heads import TrainingUnavailable
    monkeypatch.setattr(heads, "have_torch", lambda: False)
    with pytest.raises(TrainingUnavailable, match=r"predictor 'tie'.*synth.*torch"):
        make_predictor("tie", PredictorOptions(train_trace=str(synth_path)))


@pytest.mark.skipif(not LMSYS.is_file(), reason="traces/lmsys.parquet not recorded yet")
@pytest.mark.parametrize("name", BASELINES)
def test_shipped_weights_match_the_bundled_lmsys_trace(name, monkeypatch):
    import predictors.heads as heads
    if not heads.shipped_path(name).is_file():
        pytest.skip(f"no shipped weights for {name} yet (scripts/train_baselines.py --ship)")
    monkeypatch.setattr(heads, "have_torch", lambda: False)      # a fresh install without torch
    predictor = make_predictor(name, PredictorOptions(train_trace="lmsys"))
    assert predictor.artifact.source == "shipped"


# ----------------------------------------------------------------------------- costs
def test_costs_are_the_documented_figures():
    """Per-call / per-token figures quoted in the docstrings (H100 constants of the default engine)."""
    from predictors.egtp import EGTP
    from predictors.gpu_cost import (
        BERT_BASE,
        DEBERTA_V3_BASE,
        DISTILBERT_BASE,
        OPT_125M,
        egtp_cost,
        encoder_cost,
        trail_refresh_s,
    )
    expect = {DEBERTA_V3_BASE: (1.466e-3, 0.271e-6), BERT_BASE: (1.324e-3, 0.272e-6),
              OPT_125M: (1.281e-3, 0.268e-6), DISTILBERT_BASE: (0.670e-3, 0.133e-6)}
    for enc, (call, token) in expect.items():
        cost = encoder_cost(enc)
        assert cost.gpu_s_per_call == pytest.approx(call, rel=2e-3), enc.name
        assert cost.gpu_s_per_prompt_token == pytest.approx(token, rel=3e-3), enc.name
    assert trail_refresh_s() == pytest.approx(51.8e-6, rel=2e-3)
    egtp = egtp_cost()
    assert egtp.gpu_s_per_prompt_token == pytest.approx(2.744e-6, rel=2e-3)
    assert egtp.gpu_s_per_call == pytest.approx(0.099e-3, rel=1e-2)
    assert EGTP.stage == "prefill"


def test_predictor_settings_are_json(synth_test):
    trail = untrained_trail(synth_test)
    trail.bind(synth_test, np.random.default_rng(0))
    json.dumps(trail.describe())
    assert trail.cost().gpu_s_per_refresh > 0 and trail.cost().gpu_s_per_call > 0


@pytest.mark.parametrize("name", BASELINES)
def test_runs_through_simulator_on_synthetic_at_1_5x(name, synth_predictors):
    predictors, test = synth_predictors
    profile = make_profile("qwen3-8b-h100")
    config = EngineConfig(decode_slots=16, max_resident=64)
    rate = 1.5 * measure_capacity(test, profile, config)
    arrivals = make_arrivals(ArrivalSpec(), test, rate, 0)
    for policy in ("countdown", POLICY_OF[name]):
        sim = Simulation(test, arrivals, policy=make_policy(policy), predictor=predictors[name], profile=profile,
                         config=config, record_steps=True)
        result = sim.run()
        _check_invariants(result, config)
        assert result.gpu_s_charged > 0


@pytest.mark.skipif(not LMSYS.is_file(), reason="traces/lmsys.parquet not recorded yet")
@pytest.mark.parametrize("name", BASELINES)
def test_runs_through_simulator_on_lmsys_at_1_5x(name):
    import predictors.heads as heads
    from simulator.runner import RunConfig, execute, prepare
    if not (HAVE_TORCH or heads.shipped_path(name).is_file()):
        pytest.skip("neither torch nor shipped weights")
    config = RunConfig(trace="lmsys", predictor=name, policy=POLICY_OF[name], load=1.5, requests=300)
    prepared = prepare(config, record_steps=True)
    summary, result = execute(prepared)
    _check_invariants(result, config.engine_config)
    assert result.gpu_s_charged > 0


@pytest.mark.parametrize("setting, message", [
    ("noequals", "--set expects KEY=VALUE"),
    ("epochs=abc", "--set epochs=abc: epochs needs an integer"),
    ("epoch=3", "--set epoch: not a setting of trail"),
])
def test_train_script_rejects_bad_settings_before_training(synth_path, setting, message):
    import subprocess
    import sys
    script = Path(__file__).resolve().parents[1] / "scripts" / "train_baselines.py"
    proc = subprocess.run([sys.executable, str(script), "--trace", str(synth_path), "--predictors", "trail",
                           "--set", setting], capture_output=True, text=True, timeout=scaled(120))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_tie_cvar_is_the_mean_over_the_top_tail_quantiles():
    """CVaR_0.9 over 20 quadrature points is the mean of the top two (index 18 on), exactly."""
    from predictors.tie import t_quantiles, tie_terms
    q = t_quantiles(3.5, 20)
    e, c = tie_terms(0.0, 0.5, n=20, clip_mean=1e9, clip_cvar=1e9)
    assert c[0] == pytest.approx(np.exp(0.5 * q[18:]).mean(), rel=1e-12)
    assert e[0] == pytest.approx(np.exp(0.5 * q).mean(), rel=1e-12)


def test_trail_estimate_stays_within_the_cap(synth_test):
    """total = generated + remaining, remaining clamped to [1, cap - generated]: never past the cap
    while tokens are left, one more token at the cap itself."""
    trail = untrained_trail(synth_test)
    trail.bind(synth_test, np.random.default_rng(0))
    cap = trail.cap
    rows = np.array([0, 1, 2, 3])
    top, bottom = np.eye(trail.k)[-1], np.eye(trail.k)[0]
    trail.post[rows] = [top, top, bottom, top]
    trail.g_post[rows] = [0, cap - 5, cap - 1, cap]
    generated = trail.g_post[rows].copy()
    estimate = trail._estimate(rows, generated)
    assert estimate.tolist() == [trail.mid[-1], cap, cap, cap + 1]
