"""The invariant tests' shared parts (tests/test_invariants.py and its siblings): hypothesis settings,
test doubles, generated workloads, the engine and reference runners, the invariant checks, and the
real-trace fixtures."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from core.trace import load_trace, trace_from_arrays
from policies import make_policy
from policies.base import Policy
from predictors.base import Predictor
from predictors.noisy_oracle import NoisyOracle
from predictors.oracle import Oracle
from simulator.engine import EngineConfig, RunResult, Simulation
from simulator.profiles import make_profile
from simulator.profiles.base import EngineProfile
from simulator.workload import ArrivalSpec, make_arrivals

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference_sim  # noqa: E402
from reference_prefix import with_prefix_hashes  # noqa: E402

REL = 1e-9
HYPO = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
AGREEMENT_SETTINGS = settings(max_examples=200, **HYPO)
INVARIANT_SETTINGS = settings(max_examples=100, **HYPO)


# ----------------------------------------------------------------------------- test doubles
class FixedPredictor(Predictor):
    """Arrival-stage predictor returning a fixed estimate per request (indexed by request id rN)."""

    name = "fixed"
    stage = "arrival"

    def __init__(self, values):
        self.values = [float(v) for v in values]

    def bind(self, workload, rng):
        super().bind(workload, rng)
        self._rows = np.array([self.values[int(str(rid)[1:])] for rid in workload.request_id], dtype=np.float64)

    def predict(self, rows, known=None):
        return self._rows[rows]


class ConstantPredictor(Predictor):
    """The same score for every request ("rank": a static score; "length": a fixed length)."""

    name = "constant"
    stage = "arrival"

    def __init__(self, value: float, output: str = "rank"):
        self.value = float(value)
        self.output = output

    def predict(self, rows, known=None):
        return np.full(len(rows), self.value)


def affine_step_time(prefill_tokens, prefill_sq, decode_batch, decode_context):
    return 0.01 + 0.001 * prefill_tokens + 1e-6 * prefill_sq + 0.002 * decode_batch + 1e-5 * decode_context


class FunctionProfile(EngineProfile):
    name = "function"

    def __init__(self, fn):
        self.fn = fn

    def step_time(self, prefill_tokens, prefill_sq, decode_batch, decode_context):
        return self.fn(prefill_tokens, prefill_sq, decode_batch, decode_context)


STEP_TIMES = {"unit": reference_sim.unit_step_time, "affine": affine_step_time}


# ----------------------------------------------------------------------------- workloads
@dataclass
class Case:
    prompt: list
    output: list
    arrival: list
    policy: str
    predictor: str            # none | oracle | noisy | fixed
    fixed: list | None       # predictions for "fixed"
    noise_mae: float
    seed: int
    step_time: str
    max_resident: int
    decode_slots: int
    budget: int
    wait_cap: int
    chunked_prefill: bool = False     # vLLM V1 options (off in the paper's setup)
    decodes_in_budget: bool = False
    closed_loop: int | None = None    # N in flight, the next submitted when one finishes
    kv_budget: int | None = None      # KV-token admission limit (off in the paper's setup)
    kv_blocks: int | None = None      # KV blocks with preemption (tests/test_kv_blocks.py)
    block_size: int = 16
    prefix_caching: bool | None = None   # None: on with KV blocks (tests/test_kv_prefix.py)
    prefix: list | None = None        # per request, its prompt's block keys at block_size

    @property
    def config(self) -> EngineConfig:
        return EngineConfig(max_resident=self.max_resident, decode_slots=self.decode_slots,
                            prefill_token_budget=self.budget, wait_cap=self.wait_cap,
                            chunked_prefill=self.chunked_prefill, decodes_in_budget=self.decodes_in_budget,
                            kv_token_budget=self.kv_budget, kv_blocks=self.kv_blocks,
                            kv_block_size=self.block_size, prefix_caching=self.prefix_caching)


GAPS = st.one_of(
    st.just(0.0),                                        # ties: arrive at the same instant
    st.sampled_from([0.25, 0.5, 1.0, 2.0, 5.0]),
    st.floats(min_value=0.001, max_value=3.0, allow_nan=False, allow_infinity=False),
    st.integers(min_value=10, max_value=150).map(float),  # idle gaps
)
PREDICTION = st.one_of(st.integers(min_value=1, max_value=80).map(float),
                       st.floats(min_value=1.0, max_value=80.0, allow_nan=False, allow_infinity=False))


@st.composite
def cases(draw, policies=("fcfs", "countdown", "aging"), predictors=None, step_times=("unit", "affine")):
    n = draw(st.integers(min_value=1, max_value=40))
    prompt = draw(st.lists(st.integers(min_value=1, max_value=50), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(min_value=1, max_value=60), min_size=n, max_size=n))
    start = draw(st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=10.0, allow_nan=False)))
    gaps = draw(st.lists(GAPS, min_size=n - 1, max_size=n - 1))
    times = [start]
    for g in gaps:
        times.append(times[-1] + g)
    perm = draw(st.permutations(range(n)))          # requests listed out of arrival order
    arrival = [times[p] for p in perm]
    policy = draw(st.sampled_from(policies))
    if predictors is None:
        predictors_here = ("none", "oracle", "noisy", "fixed") if policy == "fcfs" else ("oracle", "noisy", "fixed")
    else:
        predictors_here = predictors
    predictor = draw(st.sampled_from(predictors_here))
    fixed = draw(st.lists(PREDICTION, min_size=n, max_size=n)) if predictor == "fixed" else None
    return Case(prompt=prompt, output=output, arrival=arrival, policy=policy, predictor=predictor, fixed=fixed,
                noise_mae=draw(st.sampled_from([1.0, 5.0, 20.0])), seed=draw(st.integers(0, 2**16)),
                step_time=draw(st.sampled_from(step_times)),
                max_resident=draw(st.integers(1, 8)), decode_slots=draw(st.integers(1, 4)),
                budget=draw(st.integers(1, 120)), wait_cap=draw(st.integers(0, 6)))


@st.composite
def vllm_cases(draw, **case_args):
    """``cases`` (``case_args`` passed on) under vLLM V1 scheduling: chunked prefill, decodes counted
    against the token budget, and closed loop (a batch: every request submitted at one instant, N of
    them in flight)."""
    case = draw(cases(**case_args))
    case.chunked_prefill = draw(st.booleans())
    case.decodes_in_budget = draw(st.booleans())
    if draw(st.booleans()):
        case.closed_loop = draw(st.integers(min_value=1, max_value=len(case.prompt) + 2))
        case.arrival = [case.arrival[0]] * len(case.prompt)
    if not (case.chunked_prefill or case.decodes_in_budget or case.closed_loop):
        case.chunked_prefill = True
    return case


def make_predictor_for(case: Case, output=None):
    if case.predictor == "none":
        return None
    if case.predictor == "oracle":
        return Oracle()
    if case.predictor == "noisy":
        return NoisyOracle(case.noise_mae)
    return FixedPredictor(case.fixed)


def run_engine(case: Case, output=None) -> RunResult:
    output = case.output if output is None else output
    wl = trace_from_arrays("hypo", case.prompt, output)
    if case.prefix is not None:
        wl = with_prefix_hashes(wl, case.prefix, case.block_size)
    return Simulation(wl, np.asarray(case.arrival, dtype=np.float64), policy=make_policy(case.policy),
                      predictor=make_predictor_for(case), profile=FunctionProfile(STEP_TIMES[case.step_time]),
                      config=case.config, seed=case.seed, record_steps=True, closed_loop=case.closed_loop).run()


def run_case_recorded(case: Case, output=None):
    output = case.output if output is None else output
    return run_recorded(trace_from_arrays("hypo", case.prompt, output), np.asarray(case.arrival, dtype=np.float64),
                        case.policy, make_predictor_for(case), FunctionProfile(STEP_TIMES[case.step_time]),
                        case.config, case.seed)


def caller_index(result: RunResult) -> list[int]:
    """Engine rows -> the caller's request index (ids are r0, r1, ...)."""
    return [int(str(rid)[1:]) for rid in result.rows_request_id]


def to_caller_order(result: RunResult, values) -> list:
    out = [None] * len(values)
    for row, i in enumerate(caller_index(result)):
        out[i] = values[row]
    return out


def engine_predictions(case: Case, result: RunResult):
    """The predictions the engine used, in caller order (for the noisy oracle, read back)."""
    if case.predictor == "none":
        return None
    if case.predictor == "oracle":
        return list(map(float, case.output))
    if case.predictor == "fixed":
        return list(case.fixed)
    preds = to_caller_order(result, result.predicted_tokens)
    assert all(p >= 1.0 and math.isfinite(p) for p in preds)
    return preds


def run_reference(case: Case, predicted):
    return reference_sim.simulate(case.prompt, case.output, case.arrival, policy=case.policy, predicted=predicted,
                                  step_time=STEP_TIMES[case.step_time], max_resident=case.max_resident,
                                  decode_slots=case.decode_slots, prefill_token_budget=case.budget,
                                  wait_cap=case.wait_cap, chunked_prefill=case.chunked_prefill,
                                  decodes_in_budget=case.decodes_in_budget, closed_loop=case.closed_loop,
                                  kv_token_budget=case.kv_budget, kv_blocks=case.kv_blocks,
                                  block_size=case.block_size, prefix_caching=case.config.caches_prefixes,
                                  prefix_keys=case.prefix)


def close(a, b) -> bool:
    return abs(a - b) <= REL * max(1.0, abs(a), abs(b))


def assert_agrees(result: RunResult, ref: dict) -> None:
    """Engine vs reference: row order, per-request times and forced steps, and the per-step log."""
    assert caller_index(result) == ref["row_order"], "row (FCFS) order differs"
    for name in ("admit_s", "first_token_s", "finish_s"):
        engine = to_caller_order(result, result.__getattribute__(name).tolist())
        for i, (e, r) in enumerate(zip(engine, ref[name])):
            assert r is not None and math.isfinite(e), (name, i, e, r)
            assert close(e, r), f"request r{i}: {name} engine {e!r} != reference {r!r}"
    forced = to_caller_order(result, result.forced_steps.tolist())
    assert forced == ref["forced_steps"], f"forced_steps engine {forced} != reference {ref['forced_steps']}"
    log = result.step_log
    assert result.steps == len(ref["steps"]) == len(log.start_s), "number of steps differs"
    for k, step in enumerate(ref["steps"]):
        assert close(log.start_s[k], step["start_s"]), ("start_s", k, log.start_s[k], step["start_s"])
        assert close(log.duration_s[k], step["duration_s"]), ("duration_s", k)
        for field_name in ("admitted", "decoded", "forced", "ready", "resident", "waiting", "arrived", "finished"):
            assert getattr(log, field_name)[k] == step[field_name], (field_name, k, getattr(log, field_name)[k], step)


# ----------------------------------------------------------------------------- invariant checks
# Each takes a finished run and its engine config and raises AssertionError on a violation.

def _arrays(result: RunResult) -> dict:
    return result.step_log.as_arrays()


def _finished_before(log: dict) -> np.ndarray:
    return np.concatenate([[0], log["finished"][:-1]])


def check_conservation(result: RunResult, config: EngineConfig) -> None:
    n = len(result.arrival_s)
    log = _arrays(result)
    starts = log["start_s"]
    arrived_true = np.searchsorted(result.arrival_s, starts, side="right")
    assert np.array_equal(log["arrived"], arrived_true), "logged arrivals disagree with arrival times"
    prev = _finished_before(log)
    assert np.array_equal(log["arrived"], prev + log["waiting"] + log["resident"]), \
        "arrived != finished + waiting + resident"
    assert (log["waiting"] >= 0).all() and (log["resident"] >= 0).all()
    assert (np.diff(log["finished"]) >= 0).all()
    # finished counts agree with the per-request finish times
    ends = starts + log["duration_s"]
    assert np.array_equal(log["finished"], np.searchsorted(np.sort(result.finish_s), ends, side="right"))
    assert log["finished"][-1] == n, "not everything finished"
    for name in ("admit_s", "first_token_s", "finish_s"):
        assert np.isfinite(getattr(result, name)).all(), f"some request has no {name}"
    # tokens: prefill gives 1, each decode slot 1 more; forced decodes are decodes
    assert int(log["decoded"].sum()) == int((result.output_tokens - 1).sum())
    assert int(log["admitted"].sum()) == n
    assert int(log["forced"].sum()) == int(result.forced_steps.sum())


def check_limits(result: RunResult, config: EngineConfig) -> None:
    log = _arrays(result)
    assert (log["resident"] <= config.max_resident).all(), "resident > max_resident"
    assert (log["decoded"] <= config.decode_slots).all(), "decoded > decode_slots"
    assert (log["forced"] <= log["decoded"]).all()
    assert (log["decoded"] <= log["ready"]).all(), "decoded a request whose prefill was not done"
    assert (log["capacity_left"] >= 0).all()
    assert np.array_equal(log["capacity_left"], config.max_resident - log["resident"])


def check_causality(result: RunResult, config: EngineConfig) -> None:
    arrival, admit, first, finish = result.arrival_s, result.admit_s, result.first_token_s, result.finish_s
    assert (arrival <= admit).all(), "admitted before arrival"
    assert (admit < first).all(), "first token not after admission (prefill takes time)"
    assert (first <= finish).all(), "finished before its first token"
    one = result.output_tokens == 1
    assert np.array_equal(first[one], finish[one]), "a one-token request must finish with its prefill"
    assert (finish[~one] > first[~one]).all()
    # admission happens at a step start, the first token at that step's end
    log = _arrays(result)
    starts = log["start_s"]
    ends = starts + log["duration_s"]
    k = np.searchsorted(starts, admit)
    assert (k < len(starts)).all() and np.array_equal(starts[k], admit), "admission not at a step start"
    if not config.chunked_prefill:
        assert np.array_equal(ends[k], first), "first token not at the end of the admission step"
    else:   # the end of the step that completes the prompt: that step or a later one
        j = np.searchsorted(ends, first)
        assert (j < len(ends)).all() and np.array_equal(ends[j], first) and (j >= k).all(), \
            "first token not at the end of a step at or after admission"


def check_monotone_clock(result: RunResult, config: EngineConfig) -> None:
    log = _arrays(result)
    starts, durations = log["start_s"], log["duration_s"]
    assert np.isfinite(starts).all() and np.isfinite(durations).all()
    assert (durations > 0).all(), "a step of zero or negative duration"
    assert (np.diff(starts) > 0).all(), "step starts not strictly increasing"
    assert (starts[1:] >= starts[:-1] + durations[:-1]).all(), "steps overlap"
    assert (starts >= 0).all()
    assert result.steps == len(starts)


def check_work_conservation(result: RunResult, config: EngineConfig) -> None:
    log = _arrays(result)
    arrival = np.sort(result.arrival_s)
    starts, durations = log["start_s"], log["duration_s"]
    ends = starts + durations
    finished_in = log["finished"] - _finished_before(log)
    resident_after = log["resident"] - finished_in
    # the first step starts at the first arrival
    assert starts[0] == arrival[0], "engine did not start at the first arrival"
    # a step decodes everything ready up to the slot limit
    assert np.array_equal(log["decoded"], np.minimum(config.decode_slots, log["ready"])), \
        "a step left decode slots idle while requests were ready"
    # ready at a step = resident after the previous step
    assert log["ready"][0] == 0
    assert np.array_equal(log["ready"][1:], resident_after[:-1]), "ready != resident after the previous step"
    # admission is greedy: room and someone waiting -> at least one admitted; never over the room
    waiting_before = log["waiting"] + log["admitted"]
    room = config.max_resident - log["ready"]
    assert ((log["admitted"] >= 1) | (waiting_before == 0) | (room <= 0)).all(), \
        "nothing admitted although there was room and a request waiting"
    assert (log["admitted"] <= np.maximum(room, 0)).all()
    assert (log["admitted"] + log["decoded"] >= 1).all(), "an empty step"
    # no idle gap while anything is waiting or resident; idle gaps end at the next arrival
    for k in range(len(starts) - 1):
        arrived_by_end = int(np.searchsorted(arrival, ends[k], side="right"))
        waiting_at_end = arrived_by_end - log["finished"][k] - resident_after[k]
        assert waiting_at_end >= 0
        if resident_after[k] > 0 or waiting_at_end > 0:
            assert starts[k + 1] == ends[k], f"idle after step {k} although work was pending"
        else:
            next_arrival = arrival[arrived_by_end]
            assert close(starts[k + 1], next_arrival), f"idle gap after step {k} does not end at the next arrival"


ALL_CHECKS = (check_conservation, check_limits, check_causality, check_monotone_clock, check_work_conservation)


class RecordingPolicy(Policy):
    """Wraps a policy and records every question the engine asks it, with what the policy could see."""

    def __init__(self, inner: Policy):
        self.inner = inner
        self.name = inner.name
        self.uses_predictions = inner.uses_predictions
        self.calls: list[tuple] = []

    def _record(self, kind, view, rows, keys):
        rows = np.asarray(rows)
        self.calls.append((kind, view.now, tuple(rows.tolist()), tuple(view.predicted[rows].tolist()),
                           tuple(view.generated[rows].tolist()), None if keys is None else tuple(np.asarray(keys).tolist())))
        return keys

    def reset(self, n):
        self.inner.reset(n)

    def decode_keys(self, view, rows):
        return self._record("decode", view, rows, self.inner.decode_keys(view, rows))

    def admission_keys(self, view, rows):
        return self._record("admit", view, rows, self.inner.admission_keys(view, rows))


class RecordingProfile(EngineProfile):
    """Wraps a profile and records the composition of every step (one call per step, in order)."""

    name = "recording"

    def __init__(self, inner: EngineProfile):
        self.inner = inner
        self.calls: list[tuple] = []

    def step_time(self, prefill_tokens, prefill_sq, decode_batch, decode_context):
        self.calls.append((int(prefill_tokens), int(prefill_sq), int(decode_batch), int(decode_context)))
        return self.inner.step_time(prefill_tokens, prefill_sq, decode_batch, decode_context)


def run_recorded(workload, arrival, policy: str, predictor, profile: EngineProfile, config=EngineConfig(), seed=0):
    """A run whose policy and profile record what they were shown."""
    rec_policy, rec_profile = RecordingPolicy(make_policy(policy)), RecordingProfile(profile)
    result = Simulation(workload, arrival, policy=rec_policy, predictor=predictor, profile=rec_profile,
                        config=config, seed=seed, record_steps=True).run()
    return result, rec_policy.calls, rec_profile.calls


def check_oracle_boundary(run, output, longer):
    """Change the true lengths of some requests (longer ones only) and keep the predictions the same.

    ``run(output)`` returns (RunResult, policy calls, profile calls) of a recorded run. Everything
    up to the first completion that differs - the first time a request whose length changed
    finishes in the original run - must be identical: every question put to the policy (rows,
    predictions, generated counts, returned keys), every step's composition and log entry, every
    admission, first token and finish before it.
    """
    output = np.asarray(output)
    changed = np.asarray(longer) != output
    assert changed.any() and (np.asarray(longer) >= output).all()
    (a, calls_a, steps_a), (b, calls_b, steps_b) = run(list(map(int, output))), run(list(map(int, longer)))
    assert caller_index(a) == caller_index(b)
    rows_changed = changed[caller_index(a)]
    cutoff = float(a.finish_s[rows_changed].min())
    la, lb = _arrays(a), _arrays(b)
    k = int((la["start_s"] < cutoff).sum())        # steps composed before the first differing completion
    assert len(lb["start_s"]) >= k
    assert steps_a[:k] == steps_b[:k], "step composition differs before the first changed completion"
    early_a = [c for c in calls_a if c[1] < cutoff]
    early_b = [c for c in calls_b if c[1] < cutoff]
    assert early_a == early_b, "the policy was shown different state before the first changed completion"
    for name in ("start_s", "duration_s", "admitted", "decoded", "forced", "ready", "resident", "waiting", "arrived"):
        assert np.array_equal(la[name][:k], lb[name][:k]), f"schedule differs before the first changed completion ({name})"
    ends_before = (la["start_s"] + la["duration_s"])[:k] < cutoff
    assert np.array_equal(la["finished"][:k][ends_before], lb["finished"][:k][ends_before])
    early = a.admit_s < cutoff
    assert np.array_equal(a.admit_s[early], b.admit_s[early]), "admission differs before the first changed completion"
    early = a.first_token_s <= cutoff
    assert np.array_equal(a.first_token_s[early], b.first_token_s[early])
    early = (a.finish_s < cutoff) | ((a.finish_s == cutoff) & ~rows_changed)
    assert np.array_equal(a.finish_s[early], b.finish_s[early]), "a completion differs before the first changed one"
    assert (b.finish_s[rows_changed & (a.finish_s == cutoff)] > cutoff).all()


# ----------------------------------------------------------------------------- real trace runs
REAL_N = 400
REAL_LOADS = (0.5, 2.0)        # multiples of saturated FCFS capacity
REAL_POLICIES = ("fcfs", "countdown", "aging")


@pytest.fixture(scope="module")
def sharegpt():
    return load_trace("sharegpt-lengths").take(np.arange(REAL_N))


@pytest.fixture(scope="module")
def roofline():
    return make_profile("qwen3-8b-h100")


@pytest.fixture(scope="module")
def capacity(sharegpt, roofline):
    """Saturated FCFS throughput (req/s): all requests queued at t=0 (computed here, no disk cache)."""
    result = Simulation(sharegpt, np.zeros(REAL_N), policy=make_policy("fcfs"), predictor=None,
                        profile=roofline).run()
    return REAL_N / result.makespan_s


@pytest.fixture(scope="module")
def real_runs(sharegpt, roofline, capacity):
    runs = {}
    for load in REAL_LOADS:
        arrival = make_arrivals(ArrivalSpec("poisson"), sharegpt, load * capacity, seed=7)
        for policy in REAL_POLICIES:
            predictor = None if policy == "fcfs" else Oracle()
            runs[(policy, load)] = Simulation(sharegpt, arrival, policy=make_policy(policy), predictor=predictor,
                                              profile=roofline, record_steps=True).run()
    # the runs must actually exercise contention above capacity and none below
    assert max(runs[("fcfs", 2.0)].step_log.ready) > EngineConfig().decode_slots
    return runs


def _check_real(real_runs, check):
    for key, result in real_runs.items():
        try:
            check(result, EngineConfig())
        except AssertionError as exc:
            raise AssertionError(f"{check.__name__} failed on sharegpt run {key}: {exc}") from exc
