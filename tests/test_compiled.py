"""The compiled step replays the reference engine byte for byte (``simulate --kernel compiled``).

Hypothesis workloads (the invariant tests' strategies) and real traces run under both kernels; every
per-request array, the step count, the contended steps, the in-use error and the summary (less
``sim_cpu_s``) must be identical. Configurations the kernel does not cover must say so and give the
reference engine's numbers.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# numba itself is imported only when a test runs the kernel (not at collection): once loaded, it
# trips vLLM 0.32's dispatcher scan in a vLLM engine started later in the same process
if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

from core.trace import trace_from_arrays  # noqa: E402
from policies import make_policy  # noqa: E402
from simulator.compiled import unsupported  # noqa: E402
from simulator.engine import EngineConfig, Simulation  # noqa: E402
from simulator.profiles import make_profile  # noqa: E402
from simulator.profiles.unit import UnitProfile  # noqa: E402
from simulator.runner import RunConfig, execute, prepare, run_simulation  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_invariants import HYPO, FixedPredictor, cases, make_predictor_for, vllm_cases  # noqa: E402

from predictors.base import Known, PendingUpdate, PredictorCost  # noqa: E402


class QueueAwareCharged(FixedPredictor):
    """An arrival-stage predictor scored in Python: reads Known, charges the GPU, maybe rank-only."""

    name = "queue-aware"

    def __init__(self, values, output: str):
        super().__init__(values)
        self.output = output

    def predict(self, rows, known: Known | None = None):
        assert known is not None
        return self._rows[rows] + 0.37 * known.arrived - 0.11 * known.finished

    def cost(self, hardware=None):
        return PredictorCost(gpu_s_per_call=0.013, gpu_s_per_request=0.0021, gpu_s_per_prompt_token=1.7e-5)

ARRAYS = ("arrival_s", "admit_s", "first_token_s", "finish_s", "admit_step", "first_token_step", "finish_step",
          "predicted_tokens", "predicted_ready_s", "forced_steps", "rows_request_id", "output_tokens")
SCALARS = ("steps", "contended_steps", "mae_in_use", "gpu_s_charged", "predictor_cpu_s", "updates_published")


def assert_identical(ref, comp) -> None:
    for name in ARRAYS:
        a, b = np.asarray(getattr(ref, name)), np.asarray(getattr(comp, name))
        assert a.dtype == b.dtype, name
        assert (a.tolist() == b.tolist()) if a.dtype == object else a.tobytes() == b.tobytes(), name
    for name in SCALARS:
        assert repr(getattr(ref, name)) == repr(getattr(comp, name)), name


def replay_both(config: RunConfig, check=lambda prepared: None):
    """Run ``config`` on both kernels (the compiled one really running: no fallback; ``check`` sees
    each prepared run); their summaries (less ``sim_cpu_s``) and results must be identical. Returns
    the compiled run's result."""
    runs = {}
    for kernel in ("reference", "compiled"):
        prepared = prepare(dataclasses.replace(config, kernel=kernel))
        assert unsupported(prepared.simulation) is None
        check(prepared)
        summary, result = execute(prepared)
        summary.pop("sim_cpu_s")
        runs[kernel] = summary, result
    assert repr(runs["reference"][0]) == repr(runs["compiled"][0])
    assert_identical(runs["reference"][1], runs["compiled"][1])
    return runs["compiled"][1]


REGISTRY_N = 48
REGISTRY_CONFIG = EngineConfig(max_resident=24, decode_slots=4, prefill_token_budget=4096, wait_cap=16)


def _registry_pairs():
    """Every registered (predictor, policy) pair the CLI accepts, generated from the registries, so
    a new entry is held to byte identity without editing this file."""
    from policies import POLICIES
    from predictors import PREDICTORS
    return [(pred, pol) for pol, cls in POLICIES.items() for pred in ["none", *PREDICTORS]
            if not (pred == "none" and cls.uses_predictions)]


@pytest.fixture(scope="module")
def registry_workload():
    from core.trace import load_trace
    trace = load_trace("lmsys")
    return trace, trace.take(np.arange(REGISTRY_N))


@pytest.mark.parametrize(("predictor", "policy"), _registry_pairs())
def test_every_pair_the_kernel_accepts_is_byte_identical(predictor, policy, registry_workload):
    """Each pair the compiled kernel accepts (its declarations, not a list here) replays byte for
    byte; a pair it refuses must say why and is skipped with that reason."""
    from predictors import make_predictor
    trace, workload = registry_workload
    arrival = np.arange(REGISTRY_N) * 0.05       # a burst: the policy chooses
    profile = make_profile("qwen3-8b-h100", trace)
    results = {}
    for kernel in ("reference", "compiled"):
        sim = Simulation(workload, arrival, policy=make_policy(policy, slos=(("ttft", 500.0), ("tpot", 50.0))),
                         predictor=None if predictor == "none" else make_predictor(predictor),
                         profile=profile, config=REGISTRY_CONFIG, seed=1)
        reason = unsupported(sim)
        if reason is not None:
            pytest.skip(f"not compiled: {reason}")
        results[kernel] = run_simulation(sim, kernel)
    assert_identical(results["reference"], results["compiled"])


def simulate(case, kernel: str, profile, predictor=None):
    wl = trace_from_arrays("hypo", case.prompt, case.output)
    sim = Simulation(wl, np.asarray(case.arrival, dtype=np.float64), policy=make_policy(case.policy),
                     predictor=predictor or make_predictor_for(case), profile=profile, config=case.config,
                     seed=case.seed, closed_loop=case.closed_loop)
    assert kernel == "reference" or unsupported(sim) is None   # the kernel really ran
    return run_simulation(sim, kernel)


@settings(max_examples=150, **HYPO)
@given(cases(policies=("fcfs", "countdown"), predictors=("fixed",)))
def test_compiled_matches_reference_with_python_scored_predictors(case):
    """Scores computed in Python at each arrival (queue-aware, GPU-charged, length or rank)."""
    output = "rank" if case.seed % 2 else "length"
    profile = UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")
    ref = simulate(case, "reference", profile, QueueAwareCharged(case.fixed, output))
    assert_identical(ref, simulate(case, "compiled", profile, QueueAwareCharged(case.fixed, output)))


@settings(max_examples=300, **HYPO)
@given(cases(policies=("fcfs", "countdown", "trail-preemption"), predictors=("oracle", "noisy", "fixed")))
def test_compiled_matches_reference_on_hypothesis_workloads(case):
    case.decodes_in_budget = case.seed % 2 == 1
    profile = UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")
    assert_identical(simulate(case, "reference", profile), simulate(case, "compiled", profile))


class PrefillStage(FixedPredictor):
    """A hidden-state predictor: its estimate exists once prefill reaches the tapped layer plus its
    CPU time, often after the step ends (a SimPy event between steps)."""

    name = "prefill-fixed"
    stage = "prefill"

    def __init__(self, values, cpu_s: float, tap: float):
        super().__init__(values)
        self.cpu_s, self.tap = cpu_s, tap

    def predict(self, rows, known: Known | None = None):
        assert known is not None
        return self._rows[rows] + 0.29 * known.arrived - 0.13 * known.finished

    def cost(self, hardware=None):
        return PredictorCost(gpu_s_per_call=0.011, gpu_s_per_request=0.0023, gpu_s_per_prompt_token=1.3e-5,
                             cpu_s_per_prediction=self.cpu_s, tap_fraction=self.tap)


@settings(max_examples=300, **HYPO)
@given(cases(policies=("fcfs", "countdown", "trail-preemption"), predictors=("fixed",)))
def test_compiled_matches_reference_with_prefill_stage_predictors(case):
    cpu_s = [0.0, 0.3, 1.7, 0.004][case.seed % 4]
    tap = [1.0, 0.5, 0.8][case.seed % 3]
    case.chunked_prefill = case.seed % 5 == 0
    case.decodes_in_budget = case.seed % 7 == 0
    profile = UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")
    ref = simulate(case, "reference", profile, PrefillStage(case.fixed, cpu_s, tap))
    assert_identical(ref, simulate(case, "compiled", profile, PrefillStage(case.fixed, cpu_s, tap)))


class OnlineLearning(PrefillStage):
    """A hidden-state predictor that learns online: feedback returns an update every ``batch``
    finished rows (the CPU worker runs them one after another, the i-th ``update_s[i % len]`` long,
    0 included), each publish shifts every estimate, and an estimate depends on the size of the batch
    it is asked in, so both the publishes' timing against the steps and the rows re-scored show in
    the outputs."""

    name = "online-fixed"
    learns_online = True

    def __init__(self, values, cpu_s: float, tap: float, batch: int, update_s: tuple[float, ...]):
        super().__init__(values, cpu_s, tap)
        self.feedback_batch, self.update_s = batch, update_s
        self.shift, self.buffered, self.updates = 0.0, [], 0

    def predict(self, rows, known: Known | None = None):
        return super().predict(rows, known) + self.shift + 0.003 * len(rows)

    def feedback(self, rows, output_tokens):
        self.buffered.extend(zip(rows.tolist(), output_tokens.tolist()))
        if len(self.buffered) < self.feedback_batch:
            return None
        error = sum(length - self._rows[r] for r, length in self.buffered) / len(self.buffered)
        self.buffered = []
        self.updates += 1
        shift = 0.5 * error + 0.01 * len(rows)

        def publish(shift=shift):
            self.shift = shift
        return PendingUpdate(cpu_s=self.update_s[self.updates % len(self.update_s)], publish=publish,
                             requests=len(rows))


@settings(max_examples=400, **HYPO)
@given(cases(policies=("fcfs", "countdown", "trail-preemption"), predictors=("fixed",)), st.integers(1, 4),
       st.lists(st.sampled_from([0.0, 0.25, 1.0, 2.5, 7.0]), min_size=1, max_size=3).map(tuple))
def test_compiled_matches_reference_with_online_learning(case, batch, update_s):
    """Feedback batched by the kernel, updates queued on the CPU worker, publishes that re-score the
    residents while a step runs, at its end (before or after it lands, by SimPy's creation order),
    or in an idle gap."""
    cpu_s = [0.0, 0.3, 1.7, 0.004][case.seed % 4]
    tap = [1.0, 0.5, 0.8][case.seed % 3]
    case.chunked_prefill = case.seed % 5 == 0
    case.decodes_in_budget = case.seed % 7 == 0
    profile = UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")
    ref = simulate(case, "reference", profile, OnlineLearning(case.fixed, cpu_s, tap, batch, update_s))
    assert_identical(ref, simulate(case, "compiled", profile, OnlineLearning(case.fixed, cpu_s, tap, batch, update_s)))


@settings(max_examples=300, **HYPO)
@given(cases(policies=("countdown",), predictors=("fixed",), step_times=("unit",)), st.integers(1, 2),
       st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 7.0]), min_size=1, max_size=3).map(tuple))
def test_compiled_matches_reference_when_publishes_tie_with_step_ends(case, batch, update_s):
    """Whole-second arrivals, one-second steps and whole-second updates: publishes land exactly on
    step ends, where SimPy's creation order decides whether a step lands first."""
    case.arrival = [float(int(a)) for a in case.arrival]
    profile = UnitProfile()
    ref = simulate(case, "reference", profile, OnlineLearning(case.fixed, 0.0, 1.0, batch, update_s))
    assert_identical(ref, simulate(case, "compiled", profile, OnlineLearning(case.fixed, 0.0, 1.0, batch, update_s)))


class Refreshing(QueueAwareCharged):
    """TRAIL's timing: scored at arrival (so it may order admission), re-estimated from the prefill
    and every ``every`` decoded tokens; each re-estimate charges the GPU in the next step. ``stage``
    "prefill" turns it into a refreshing hidden-state predictor (LEAP with refresh)."""

    name = "refreshing"
    observes_prefill = True   # its after_prefill (an arrival-stage one's; a prefill-stage one is never asked)

    def __init__(self, values, output: str, every: int, stage: str):
        super().__init__(values, output)
        self.refresh_every, self.stage = every, stage
        self.calls = 0

    def after_prefill(self, rows):
        self.calls += 1
        return self._rows[rows] * 0.9 + 1.5 + 0.25 * self.calls

    def refresh(self, rows, generated):
        self.calls += 1
        return self._rows[rows] * 1.1 + generated * 0.5 - 0.125 * self.calls

    def cost(self, hardware=None):
        return PredictorCost(gpu_s_per_call=0.013, gpu_s_per_request=0.0021, gpu_s_per_prompt_token=1.7e-5,
                             gpu_s_per_refresh=0.0071)


@settings(max_examples=300, **HYPO)
@given(cases(policies=("fcfs", "countdown", "trail-preemption"), predictors=("fixed",)), st.integers(1, 5),
       st.sampled_from(["arrival", "prefill"]))
def test_compiled_matches_reference_with_refreshing_predictors(case, every, stage):
    """Re-estimates after prefill and during decode (TRAIL, LEAP with refresh), their GPU charges,
    and the (key, row) order they move rows in; TRAIL's preemption limit locks rows whose tokens
    pass 0.8 x their first estimate."""
    output = "rank" if case.seed % 3 == 0 and case.policy != "trail-preemption" else "length"
    case.chunked_prefill = case.seed % 5 == 0
    case.decodes_in_budget = case.seed % 7 == 0
    profile = UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")
    ref = simulate(case, "reference", profile, Refreshing(case.fixed, output, every, stage))
    assert_identical(ref, simulate(case, "compiled", profile, Refreshing(case.fixed, output, every, stage)))


@pytest.mark.parametrize(("predictor", "policy"), [("trail", "countdown"), ("trail", "trail-preemption"),
                                                   ("trail", "fcfs"), ("leap", "countdown")])
def test_compiled_matches_reference_with_decode_time_refresh(predictor, policy):
    """TRAIL (prefill probe + decode-state refreshes) and LEAP with refresh on the recorded trace."""
    from predictors.base import PredictorOptions

    def refreshes(prepared):
        assert prepared.simulation.predictor.refresh_every

    replay_both(RunConfig(trace="sharegpt", predictor=predictor, policy=policy, load=1.5,
                          predictor_options=PredictorOptions(refresh=True)), refreshes)


@pytest.mark.parametrize(("trace", "load", "charge"), [("sharegpt", 1.5, True), ("alpaca", 1.0, True),
                                                       ("math", 2.0, False)])
def test_compiled_matches_reference_with_leap_rls(trace, load, charge):
    """LEAP+RLS on recorded traces (weights fitted on lmsys): its RLS publishes re-score every
    resident between compiled steps; without costs each publish lands at its feedback's instant."""
    result = replay_both(RunConfig(trace=trace, predictor="leap-rls", policy="countdown", load=load,
                                   charge_cost=charge))
    assert result.updates_published > 10


@pytest.mark.parametrize("predictor", ["leap", "leap-rls"])
def test_compiled_matches_reference_on_the_step_clock_with_leap(predictor):
    """The step clock on a recorded trace under the live runs' caps (64 resident, 16 decode slots,
    wait cap 128, 2048 tokens shared by decodes and chunks): LEAP's estimates after prefill and
    LEAP+RLS's updates published at the end of the step whose finishes complete a batch of 8."""
    from core.trace import load_trace
    from predictors import make_predictor
    from predictors.base import PredictorOptions
    from simulator.engine import EngineConfig

    wl = load_trace("alpaca").take(np.arange(200))
    gaps = np.random.default_rng(0).exponential(1 / 0.09, size=200)
    arrival = np.floor(np.concatenate([[0.0], np.cumsum(gaps[:-1])]))
    config = EngineConfig(max_resident=64, decode_slots=16, prefill_token_budget=2048, wait_cap=128,
                          chunked_prefill=True, decodes_in_budget=True)
    runs = []
    for kernel in ("reference", "compiled"):
        sim = Simulation(wl, arrival, policy=make_policy("countdown"),
                         predictor=make_predictor(predictor, PredictorOptions(train_trace="lmsys")),
                         profile=UnitProfile(), config=config, charge_cost=False, step_clock=True)
        assert kernel == "reference" or unsupported(sim) is None
        runs.append(run_simulation(sim, kernel))
    assert_identical(*runs)
    assert runs[0].contended_steps > 100 and (predictor == "leap" or runs[0].updates_published > 10)


@settings(max_examples=300, **HYPO)
@given(vllm_cases(policies=("fcfs", "countdown", "trail-preemption"), predictors=("oracle", "noisy", "fixed")))
def test_compiled_matches_reference_under_vllm_v1_scheduling(case):
    profile = UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")
    assert_identical(simulate(case, "reference", profile), simulate(case, "compiled", profile))


@settings(max_examples=150, **HYPO)
@given(vllm_cases(policies=("fcfs", "countdown"), predictors=("oracle", "fixed"), step_times=("unit",)),
       st.sampled_from(["static", "prefill", "online"]))
def test_compiled_matches_reference_on_the_step_clock(case, estimates):
    """The step clock (docs/semantics.md "Step clock"): whole-step arrivals, unit steps, nothing
    charged; ticks (idle ones included) recorded in the step columns identically, with estimates
    fixed at bind time, published after prefill, or learnt online."""
    case.arrival = [float(int(a)) for a in case.arrival]
    case.closed_loop = None
    if estimates == "static" or case.fixed is None:
        def predictor():
            return make_predictor_for(case)
    elif estimates == "prefill":
        def predictor():
            return PrefillStage(case.fixed, 0.0, 1.0)
    else:
        def predictor():
            return OnlineLearning(case.fixed, 0.0, 1.0, 2, (0.0,))
    runs = []
    for kernel in ("reference", "compiled"):
        wl = trace_from_arrays("hypo", case.prompt, case.output)
        sim = Simulation(wl, np.asarray(case.arrival, dtype=np.float64), policy=make_policy(case.policy),
                         predictor=predictor(), profile=UnitProfile(), config=case.config, seed=case.seed,
                         charge_cost=False, step_clock=True)
        assert kernel == "reference" or unsupported(sim) is None
        runs.append(run_simulation(sim, kernel))
    assert_identical(*runs)
    assert (runs[0].finish_step == runs[0].finish_s - 1).all()   # a step's tick is the clock at its start


@settings(max_examples=100, **HYPO)
@given(cases(policies=("fcfs",), predictors=("none",)))
def test_compiled_matches_reference_without_predictor(case):
    profile = UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")
    assert_identical(simulate(case, "reference", profile), simulate(case, "compiled", profile))


@pytest.mark.parametrize("load", [1.0, 2.0])
@pytest.mark.parametrize(("policy", "predictor"), [("fcfs", "none"), ("countdown", "oracle"),
                                                   ("countdown", "noisy-oracle")])
def test_compiled_matches_reference_on_real_trace(policy, predictor, load):
    replay_both(RunConfig(trace="sharegpt-lengths", predictor=predictor, policy=policy, load=load, requests=2000))


@pytest.mark.parametrize("engine", ["fitted", "qwen3-8b-h200", "llama3-8b-a100", "unit"])
def test_compiled_matches_reference_on_every_profile(engine):
    replay_both(RunConfig(trace="sharegpt", predictor="oracle", policy="countdown", engine=engine, load=1.5))


@settings(max_examples=150, **HYPO)
@given(cases(policies=("fcfs", "countdown", "trail-preemption"), predictors=("oracle", "fixed")), st.integers(0, 60), st.booleans())
def test_compiled_matches_reference_with_a_kv_budget(case, extra, chunked):
    """The optional second admission limit (KV tokens), with and without chunked prefill."""
    case.chunked_prefill = chunked
    config = dataclasses.replace(case.config, kv_token_budget=case.max_resident + extra)
    profile = UnitProfile() if case.step_time == "unit" else make_profile("qwen3-8b-h100")
    runs = []
    for kernel in ("reference", "compiled"):
        wl = trace_from_arrays("hypo", case.prompt, case.output)
        sim = Simulation(wl, np.asarray(case.arrival, dtype=np.float64), policy=make_policy(case.policy),
                         predictor=make_predictor_for(case), profile=profile, config=config, seed=case.seed)
        try:
            runs.append(run_simulation(sim, kernel))
        except Exception as exc:   # the same refusal (a stall) from both
            runs.append(repr(exc))
    if isinstance(runs[0], str) or isinstance(runs[1], str):
        assert runs[0] == runs[1]
    else:
        assert_identical(*runs)


@pytest.mark.parametrize(("policy", "predictor"), [("fcfs", "none"), ("countdown", "oracle")])
@pytest.mark.parametrize("arrivals", ["closed", "poisson"])
def test_compiled_matches_reference_on_recorded_preset(policy, predictor, arrivals):
    """The recorded serving setup: chunked prefill, decodes in the budget, closed-loop batch replay."""
    from simulator.workload import ArrivalSpec

    def chunked(prepared):
        assert prepared.simulation.config.chunked_prefill

    replay_both(RunConfig(trace="sharegpt", predictor=predictor, policy=policy, preset="recorded",
                          arrivals=ArrivalSpec.parse(arrivals), load=None if arrivals == "closed" else 1.5), chunked)
