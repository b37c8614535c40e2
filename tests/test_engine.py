"""Engine semantics by hand: the seed's example, profiles, arrivals, capacity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from core.arrivals import parse_load, read_timestamps_csv
from core.hardware import A100_80GB, LLAMA3_8B
from core.trace import load_trace, trace_from_arrays
from policies import make_policy
from predictors import make_predictor
from predictors.base import Predictor, PredictorCost, PredictorOptions
from simulator.capacity import measure_capacity
from simulator.engine import EngineConfig, Simulation
from simulator.profiles import make_profile
from simulator.profiles.fitted import FittedProfile
from simulator.profiles.roofline import RooflineProfile
from simulator.profiles.unit import UnitProfile
from simulator.workload import ArrivalSpec, make_arrivals

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def run(trace, arrivals, policy="fcfs", predictor=None, **config):
    sim = Simulation(trace, np.asarray(arrivals, dtype=float), policy=make_policy(policy),
                     predictor=make_predictor(predictor) if predictor else None, profile=UnitProfile(),
                     config=EngineConfig(**config))
    return sim.run()


def test_seed_example_fcfs_and_countdown_exact():
    """Three requests arrive together (1000, 50, 100 tokens), one decode slot, unit steps.

    Step 1 prefills all three (first token each at t=1); each further token takes one decode slot.
    FCFS: A needs 999 more steps -> 1000; B 49 more -> 1049; C 99 more -> 1148; mean 3197/3.
    Countdown with the oracle: B -> 50, C -> 149, A -> 1148; mean 1347/3 = 449.
    """
    trace = trace_from_arrays("seed", [10, 10, 10], [1000, 50, 100])
    fcfs = run(trace, [0, 0, 0], "fcfs", decode_slots=1, wait_cap=0)
    assert fcfs.finish_s.tolist() == [1000.0, 1049.0, 1148.0]
    assert fcfs.finish_s.mean() == pytest.approx(3197 / 3, abs=0)
    countdown = run(trace, [0, 0, 0], "countdown", "oracle", decode_slots=1, wait_cap=0)
    assert countdown.finish_s.tolist() == [1148.0, 50.0, 149.0]
    assert countdown.finish_s.mean() == 449.0


def test_error_in_use_is_per_decoded_token():
    """The oracle schedules on exact lengths (error 0); no predictor has no error to report."""
    trace = trace_from_arrays("seed", [10, 10, 10], [1000, 50, 100])
    assert run(trace, [0, 0, 0], "countdown", "oracle", decode_slots=1, wait_cap=0).mae_in_use == 0.0
    assert run(trace, [0, 0, 0], "fcfs", decode_slots=1).mae_in_use is None


def test_wait_cap_forces_a_starving_request():
    # one slot, countdown would starve the 1000-token request; the cap forces it every 3rd step
    trace = trace_from_arrays("cap", [1, 1], [20, 1000])
    result = run(trace, [0, 0], "countdown", "oracle", decode_slots=1, wait_cap=2)
    assert result.forced_steps[1] > 0 and result.forced_steps[0] == 0
    # r0 decodes in 2 of every 3 steps: 19 tokens after prefill take 28 steps -> finishes at t=29
    assert result.finish_s[0] == 29.0


def test_single_token_request_finishes_at_prefill():
    result = run(trace_from_arrays("one", [5], [1]), [2.5])
    assert result.first_token_s[0] == result.finish_s[0] == 3.5
    assert result.admit_s[0] == 2.5


def test_over_long_prompt_takes_a_step_alone():
    trace = trace_from_arrays("long", [50, 5, 5], [2, 2, 2])
    result = run(trace, [0, 0, 0], prefill_token_budget=10)
    assert result.first_token_s.tolist() == [1.0, 2.0, 2.0]


def test_max_resident_limits_admission():
    trace = trace_from_arrays("res", [1] * 4, [3] * 4)
    result = run(trace, [0] * 4, max_resident=2)
    assert result.admit_s.tolist() == [0.0, 0.0, 3.0, 3.0]


def test_roofline_matches_vidur_anchor():
    """Non-attention step time of Llama-3-8B on an A100 vs Vidur's profile, within 10%."""
    profile = RooflineProfile(LLAMA3_8B, A100_80GB)
    for tokens, vidur_ms in [(1, 9.7), (64, 11.2), (256, 19.5), (1024, 75.0), (4096, 273.0)]:
        assert profile.linear_time(tokens) * 1e3 == pytest.approx(vidur_ms, rel=0.10)


def test_roofline_default_profile_shape():
    p = make_profile("qwen3-8b-h100")
    small = p.step_time(0, 0, 1, 100)
    assert 0.008 < small < 0.015                         # eager floor ~11 ms
    assert p.step_time(0, 0, 64, 64 * 2000) > p.step_time(0, 0, 64, 64 * 100)  # KV reads cost
    assert p.step_time(8192, 8192 ** 2, 0, 0) > 5 * small                      # big prefill is compute bound
    assert make_profile("qwen3-8b-h200").step_time(0, 0, 1, 100) < small


def test_fitted_profile_recovers_coefficients():
    rng = np.random.default_rng(1)
    prefill = rng.integers(0, 2000, 300)
    decode = rng.integers(0, 64, 300)
    step_s = 0.004 + 2e-6 * prefill + 1e-4 * decode + rng.normal(0, 1e-6, 300)
    steps = pa.table({"step_index": np.arange(300), "step_s": step_s, "prefill_tokens": prefill,
                      "decode_requests": decode})
    fitted = FittedProfile.fit(steps, "synthetic")
    assert fitted.coefficients["intercept"] == pytest.approx(0.004, rel=0.02)
    assert fitted.coefficients["prefill_tokens"] == pytest.approx(2e-6, rel=0.02)
    assert fitted.step_time(1000, 0, 10, 0) == pytest.approx(0.004 + 2e-3 + 1e-3, rel=0.01)
    assert fitted.r2 > 0.99


def test_fitted_profile_needs_steps_table():
    with pytest.raises(ValueError, match="needs a steps table"):
        make_profile("fitted", load_trace("sharegpt-lengths"))


@pytest.mark.parametrize("text, value", [("1.5x", 1.5), ("2", 2.0), ("0.25X", 0.25)])
def test_parse_load(text, value):
    assert parse_load(text) == value


@pytest.mark.parametrize("text", ["abc", "-1x", "0x", "", "1.5y", "nanx"])
def test_parse_load_rejects(text):
    with pytest.raises(ValueError):
        parse_load(text)


def test_poisson_arrivals_are_seeded_with_the_right_rate():
    trace = trace_from_arrays("p", np.ones(20000, int), np.ones(20000, int))
    a = make_arrivals(ArrivalSpec("poisson"), trace, 4.0, seed=7)
    assert np.array_equal(a, make_arrivals(ArrivalSpec("poisson"), trace, 4.0, seed=7))
    assert not np.array_equal(a, make_arrivals(ArrivalSpec("poisson"), trace, 4.0, seed=8))
    assert a[0] == 0 and np.all(np.diff(a) >= 0)
    assert (len(a) - 1) / a[-1] == pytest.approx(4.0, rel=0.03)


def test_azure_arrivals_rescaled_to_mean_rate():
    path = SHARED / "arrivals" / "AzureLLMInferenceTrace_conv.csv"
    times = read_timestamps_csv(path)
    assert len(times) == 19366 and times[0] == 0
    assert (len(times) - 1) / times[-1] == pytest.approx(5.53, rel=0.01)
    trace = trace_from_arrays("a", np.ones(500, int), np.ones(500, int))
    a = make_arrivals(ArrivalSpec.parse(str(path)), trace, 2.0, seed=0)
    assert (len(a) - 1) / a[-1] == pytest.approx(2.0, rel=1e-9)
    gaps = np.diff(a)
    assert np.allclose(gaps / gaps.sum(), np.diff(times[:500]) / times[499])   # shape kept, only stretched


def test_trace_arrivals_need_recorded_times():
    with pytest.raises(ValueError, match="no recorded arrival_s"):
        make_arrivals(ArrivalSpec("trace"), load_trace("sharegpt-lengths"), 1.0, 0)
    trace = trace_from_arrays("t", [1, 1, 1], [1, 1, 1], arrival_s=[0.0, 1.0, 3.0])
    assert np.allclose(make_arrivals(ArrivalSpec("trace"), trace, 2.0, 0), [0.0, 1 / 3, 1.0])  # gaps 1:2, span (n-1)/rate
    # rows not in arrival order keep their own times (rescaled), not the sorted sequence in row order
    shuffled = trace_from_arrays("u", [1, 1, 1, 1], [1, 1, 1, 1], arrival_s=[30.0, 0.0, 20.0, 10.0])
    assert np.allclose(make_arrivals(ArrivalSpec("trace"), shuffled, 1.0, 0), [3.0, 0.0, 2.0, 1.0])


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_csv_arrivals_must_be_finite(tmp_path, bad):
    path = tmp_path / "a.csv"
    path.write_text(f"TIMESTAMP\n0\n1\n{bad}\n3\n")
    with pytest.raises(ValueError, match=rf"a.csv: column TIMESTAMP: row 2: {bad} is not a finite, non-negative time"):
        read_timestamps_csv(path)


def test_capacity_is_saturated_fcfs_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path))
    trace = trace_from_arrays("c", [1] * 6, [4] * 6)
    cap = measure_capacity(trace, UnitProfile(), EngineConfig(decode_slots=2))
    # steady state of a long stream of this mix: each request needs 3 decode tokens after its
    # prefill (first token), 2 decode slots per 1 s step -> 2/3 request per second (the old
    # "6 requests / makespan" gave 0.6: one prefill step and no steady state)
    assert cap == pytest.approx(2 / 3, rel=1e-9)
    assert (tmp_path / "capacity.json").is_file()
    assert measure_capacity(trace, UnitProfile(), EngineConfig(decode_slots=2)) == cap


def test_noisy_oracle_has_the_requested_mae():
    trace = trace_from_arrays("n", np.ones(20000, int), np.full(20000, 5000))
    pred = make_predictor("noisy-oracle", PredictorOptions(noise_mae=100.0))
    pred.bind(trace, np.random.default_rng(0))
    err = np.abs(pred.predict(np.arange(20000)) - 5000)
    assert err.mean() == pytest.approx(100.0, rel=0.03)


def test_engine_config_validation():
    with pytest.raises(ValueError, match="decode-slots"):
        EngineConfig(decode_slots=0)
    with pytest.raises(ValueError, match="wait-cap"):
        EngineConfig(wait_cap=-1)


class _SlowCPUPredictor(Predictor):
    """A prefill-stage predictor whose CPU time may outlast the rest of the prefill step."""

    name = "slow-cpu"
    stage = "prefill"

    def __init__(self, cpu_s, tap):
        self._cost = PredictorCost(cpu_s_per_prediction=cpu_s, tap_fraction=tap)

    def bind(self, workload, rng):
        super().bind(workload, rng)

    def predict(self, rows, known=None):
        return np.full(len(rows), 7.0)

    def cost(self, hardware=None):
        return self._cost


@pytest.mark.parametrize("cpu_s, tap, ready", [
    (0.2, 0.5, 1.0),    # tapped at 0.5 s, CPU done at 0.7 s: ready by the end of the 1 s prefill step
    (0.8, 0.5, 1.3),    # done at 1.3 s: 0.3 s late, i.e. max(0, CPU time - time left after the tap)
    (0.0, 1.0, 1.0),
])
def test_hidden_state_prediction_ready_after_cpu_time(cpu_s, tap, ready):
    trace = trace_from_arrays("cpu", [4], [10])
    result = Simulation(trace, np.zeros(1), policy=make_policy("countdown"), predictor=_SlowCPUPredictor(cpu_s, tap),
                        profile=UnitProfile(), config=EngineConfig()).run()
    assert result.predicted_ready_s[0] == pytest.approx(ready)
    assert result.predicted_tokens[0] == 7.0
    assert result.predictor_cpu_s == pytest.approx(cpu_s)


def test_no_prediction_cost_when_not_charged():
    trace = trace_from_arrays("cpu", [4], [10])
    result = Simulation(trace, np.zeros(1), policy=make_policy("countdown"), predictor=_SlowCPUPredictor(0.8, 0.5),
                        profile=UnitProfile(), config=EngineConfig(), charge_cost=False).run()
    assert result.predicted_ready_s[0] == 1.0 and result.predictor_cpu_s == 0.0


class _HardwareSeen(Predictor):
    """Records the hardware its cost is asked for, and peeks at the true lengths if told to."""

    name = "hardware-seen"
    stage = "arrival"

    def __init__(self, peek=False):
        self.seen, self.peek = [], peek

    def bind(self, workload, rng):
        super().bind(workload, rng)
        if self.peek:
            _ = workload.output_tokens

    def predict(self, rows, known=None):
        return np.full(len(rows), 3.0)

    def cost(self, hardware=None):
        self.seen.append(hardware)
        return PredictorCost(gpu_s_per_call=1e-3)


def test_predictor_cost_is_charged_on_the_runs_engine():
    """`--engine llama3-8b-a100` charges A100 costs (it charged H100 costs before)."""
    from core.hardware import DEFAULT_HARDWARE, Hardware
    from predictors.gpu_cost import DEBERTA_V3_BASE, encoder_cost
    trace = trace_from_arrays("hw", [4, 4], [3, 3])
    for profile, expected in [(make_profile("llama3-8b-a100"), Hardware(LLAMA3_8B, A100_80GB)),
                              (make_profile("qwen3-8b-h100"), DEFAULT_HARDWARE), (UnitProfile(), DEFAULT_HARDWARE)]:
        pred = _HardwareSeen()
        Simulation(trace, np.zeros(2), policy=make_policy("countdown"), predictor=pred, profile=profile).run()
        assert pred.seen == [expected], profile.describe()
    tie = make_predictor("tie")
    a100 = tie.cost(make_profile("llama3-8b-a100").hardware)
    assert a100 == encoder_cost(DEBERTA_V3_BASE, A100_80GB) and a100.gpu_s(1, 100) > tie.cost().gpu_s(1, 100)


def test_predictors_are_bound_without_the_true_lengths():
    """No peeking is structural: a non-oracle predictor's trace has no output lengths; oracles opt in."""
    from core.trace import TraceError
    trace = trace_from_arrays("blind", [4, 4], [3, 5])
    with pytest.raises(TraceError, match="true output lengths are hidden"):
        Simulation(trace, np.zeros(2), policy=make_policy("countdown"), predictor=_HardwareSeen(peek=True),
                   profile=UnitProfile())
    oracle = make_predictor("oracle")
    result = Simulation(trace, np.zeros(2), policy=make_policy("countdown"), predictor=oracle, profile=UnitProfile()).run()
    assert result.predicted_tokens.tolist() == [3.0, 5.0]


def test_a_simulation_runs_once():
    trace = trace_from_arrays("once", [4], [3])
    sim = Simulation(trace, np.zeros(1), policy=make_policy("fcfs"), predictor=None, profile=UnitProfile())
    sim.run()
    with pytest.raises(RuntimeError, match="runs once"):
        sim.run()
