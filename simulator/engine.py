"""The engine: a SimPy discrete-event replay of one vLLM-like serving engine.

The step loop only orchestrates, one SimPy timeout per engine step: the :class:`Scheduler`
composes the step (admission, prefill chunks, decode choice), the engine profile times it, the
:class:`RequestTable` lands its tokens, and the prediction driver (:mod:`simulator.prediction`;
the null driver without a predictor) publishes estimates, charges costs and runs online updates
on a separate CPU worker process. Rows are numbered in (arrival time, trace row) order, which
makes "row order" the FCFS order and the final tie-break of every sort. Semantics:
``docs/semantics.md`` (the step clock: its "Step clock" section).

A step = prefill of the requests admitted this step (their first output token) + one decode token
for up to ``decode_slots`` resident requests: first those forced by the wait cap, then the
policy's ranking. The true output length is read only to decide completion.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np
import simpy

from core.prefix_hashes import check_block_size, native_chains
from core.trace import Trace
from policies.base import Policy
from predictors.base import Predictor, PredictorCost
from simulator.config import EngineConfig
from simulator.prediction import NoPrediction
from simulator.prefix_cache import PrefixKVBlocks
from simulator.profiles.base import EngineProfile
from simulator.requests import NOT_YET, RequestTable
from simulator.scheduler import SimulationStalled
from simulator.stepping import EngineParts, build_parts

#: the paper's vLLM setup (512 resident, 64 decode slots); frozen, so one instance serves every default
DEFAULT_ENGINE_CONFIG = EngineConfig()

__all__ = ["NOT_YET", "EngineConfig", "RunResult", "Simulation", "SimulationStalled", "StepLog", "StepRunner"]


@dataclass
class StepLog:
    """Per-step records, kept only when asked (invariant tests, debugging)."""

    start_s: list = field(default_factory=list)
    duration_s: list = field(default_factory=list)
    admitted: list = field(default_factory=list)      # requests prefilled this step
    decoded: list = field(default_factory=list)       # decode slots used
    forced: list = field(default_factory=list)        # of which forced by the wait cap
    ready: list = field(default_factory=list)         # resident requests able to decode at step start
    resident: list = field(default_factory=list)      # resident during the step (incl. prefilling)
    waiting: list = field(default_factory=list)       # arrived, not admitted, after admission
    arrived: list = field(default_factory=list)       # arrived by step start
    finished: list = field(default_factory=list)      # finished by step end
    capacity_left: list = field(default_factory=list) # free resident places after admission

    def record(self, start: float, duration: float, batch, arrived: int, max_resident: int) -> None:
        # a carried chunk holds a place; preempted rows leave, readmitted ones hold one again
        holding = batch.ready + len(batch.admit) + (batch.carried >= 0) + len(batch.readmit) - len(batch.preempted)
        self.start_s.append(start)
        self.duration_s.append(duration)
        self.admitted.append(len(batch.admit))
        self.decoded.append(len(batch.chosen))
        self.forced.append(batch.n_forced)
        self.ready.append(batch.ready)
        self.resident.append(holding)
        self.arrived.append(arrived)
        self.capacity_left.append(max_resident - holding)
        self.waiting.append(batch.waiting)

    def as_arrays(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in asdict(self).items()}


@dataclass
class RunResult:
    """Everything a run produced; per-request arrays are in row order."""

    workload: Trace
    rows_request_id: np.ndarray
    arrival_s: np.ndarray
    admit_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    admit_step: np.ndarray            # step indices (docs/semantics.md "Step clock"; simulator.requests.clock_step)
    first_token_step: np.ndarray
    finish_step: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    predicted_tokens: np.ndarray      # first estimate (nan for no predictor)
    predicted_ready_s: np.ndarray     # when that estimate became usable
    forced_steps: np.ndarray
    steps: int
    gpu_s_charged: float
    predictor_cpu_s: float
    updates_published: int
    sim_cpu_s: float
    step_log: StepLog | None = None
    output_kind: str = "length"       # the predictor's output: "length", or "rank" (no MAE)
    mae_in_use: float | None = None   # |estimate - true length| per decoded token, refreshes included
    contended_steps: int = 0          # steps in which the policy's order decided something (see _step_loop)
    # a fleet's run (simulator/fleet.py): the replica each request was routed to, and the balance
    replica: np.ndarray | None = None
    replicas: int = 1
    balance_max_over_mean: float | None = None   # outstanding true work, max / mean over replicas, at routings
    preemptions: np.ndarray | None = None   # per row, times preempted (KV blocks; None: unbounded KV)
    cached_tokens: np.ndarray | None = None   # per row, prompt tokens found cached at admission (prefix caching)
    # a prefill/decode fleet's run (simulator/pd_fleet.py): per row, its prefill and decode instance,
    # its prefill's end, its transfer's start and landing; and the number of each instance
    stages: dict[str, np.ndarray] | None = None
    pd_replicas: tuple[int, int] | None = None

    @property
    def makespan_s(self) -> float:
        return float(np.nanmax(self.finish_s)) if len(self.finish_s) else 0.0


def check_step_clock(arrival_s: np.ndarray, profile: EngineProfile, charge_cost: bool) -> None:
    """The step clock's preconditions: integer arrival steps, unit-time steps, nothing charged on top
    (so the clock is an integer at every step start and counts ticks exactly)."""
    from simulator.profiles.unit import UnitProfile

    if type(profile) is not UnitProfile:
        raise ValueError(f"the step clock needs the unit engine profile (every step 1.0), got {profile.name!r}")
    if charge_cost:
        raise ValueError("the step clock charges no predictor cost (a step lasts 1.0 whatever it holds)")
    if len(arrival_s) and not (np.floor(arrival_s) == arrival_s).all():
        raise ValueError("the step clock needs integer arrival steps")


class StepRunner(Protocol):
    """What runs a :class:`Simulation`'s steps in place of its own loop, writing the same request table
    (``simulator.compiled.CompiledRun``); the run's counters are read from it afterwards."""

    @property
    def finished(self) -> int: ...

    @property
    def steps(self) -> int: ...

    @property
    def contended(self) -> int: ...

    @property
    def mae_in_use(self) -> float | None: ...

    @property
    def cached_tokens(self) -> np.ndarray | None: ...

    def step_process(self, env: simpy.Environment, progress: Callable[[int, int], None] | None = None
                     ) -> Generator: ...

    def fill_step_log(self, log: StepLog) -> None: ...


def checked_arrivals(workload: Trace, arrival_s) -> np.ndarray:
    """One finite, non-negative arrival time per request (float64): an engine's and a fleet's input."""
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    if arrival_s.shape != (len(workload),):
        raise ValueError(f"need one arrival time per request ({len(workload)}), got {arrival_s.shape}")
    if not np.isfinite(arrival_s).all() or (arrival_s < 0).any():
        raise ValueError("arrival times must be finite and >= 0")
    return arrival_s


def check_kv_blocks(workload: Trace, config: EngineConfig) -> None:
    """Every request must fit the KV cache alone (its prompt and all but its last output token),
    or it could never finish (docs/semantics.md "KV blocks")."""
    if not config.kv_bounded or not len(workload):
        return
    total, size = config.kv_blocks_total, config.kv_block_size
    chains = native_chains(workload) if config.caches_prefixes else None
    if chains is not None:   # the trace's prefix blocks must map to --block-size (core.prefix_hashes)
        check_block_size(chains[2], size, f"trace {workload.name!r}")
    prompt = workload.prompt_tokens.astype(np.int64)
    tokens = prompt + np.maximum(workload.output_tokens.astype(np.int64) - 1, 0)
    for what, need in (("prompt", -(-prompt // size)), ("prompt and output", -(-tokens // size))):
        row = int(np.argmax(need))
        if need[row] > total:
            raise ValueError(f"--kv-blocks {total} (x --block-size {size} tokens) cannot hold request "
                             f"{workload.request_id[row]} (row {row}) of trace {workload.name!r}: its {what} "
                             f"({int(tokens[row] if what != 'prompt' else prompt[row])} tokens) needs {int(need[row])} blocks")


class Simulation:
    """One run: a workload with arrival times, a policy, a predictor, an engine profile.

    The predictor is bound to the run's workload here, once (rows in arrival order; the true
    output lengths hidden unless the predictor is an oracle); a Simulation runs once.
    ``step_clock``: arrival times are step indices and every step lasts 1.0 (the unit profile, no
    predictor cost charged), so each step is recorded under its tick (docs/semantics.md "Step clock").
    :meth:`run` runs this module's step loop, the definition; ``simulator.runner.run_simulation`` chooses
    whether the compiled kernel runs the steps instead."""

    def __init__(self, workload: Trace, arrival_s: np.ndarray, *, policy: Policy, predictor: Predictor | None,
                 profile: EngineProfile, config: EngineConfig = DEFAULT_ENGINE_CONFIG, seed: int = 0,
                 charge_cost: bool = True, record_steps: bool = False,
                 progress: Callable[[int, int], None] | None = None, closed_loop: int | None = None,
                 step_clock: bool = False):
        arrival_s = checked_arrivals(workload, arrival_s)
        if step_clock:
            check_step_clock(arrival_s, profile, charge_cost)
        check_kv_blocks(workload, config)
        if policy.uses_predictions and predictor is None:
            raise ValueError(f"policy {policy.name!r} needs a predictor")
        if closed_loop is not None and (not isinstance(closed_loop, (int, np.integer)) or closed_loop < 1):
            raise ValueError(f"closed loop needs a window of at least 1 request, got {closed_loop!r}")
        if closed_loop is not None and len(arrival_s) and (arrival_s != arrival_s[0]).any():
            # later rows are released at completions; with staggered times the release order is undefined
            raise ValueError("closed loop replays a batch: every request must be submitted at the same time")
        order = np.argsort(arrival_s, kind="stable")   # ties keep row (submission) order
        self.workload = workload.take(order) if not np.array_equal(order, np.arange(len(order))) else workload
        self.arrival = arrival_s[order]
        # closed loop: the first `closed_loop` rows are submitted at their arrival times, each later
        # row when an earlier one finishes (arrival +inf until then), as a batch recording ran
        self.closed_loop = int(closed_loop) if closed_loop is not None else None
        if self.closed_loop is not None:
            self.arrival = self.arrival.copy()
            self.arrival[self.closed_loop:] = np.inf
        self.policy, self.predictor, self.profile, self.config = policy, predictor, profile, config
        self.charge_cost, self.record_steps, self.progress = charge_cost, record_steps, progress
        self.step_clock = step_clock
        if predictor is not None:
            shown = self.workload if predictor.sees_true_lengths else self.workload.without_lengths()
            predictor.bind(shown, np.random.default_rng(seed))
        self._ran = False

    @property
    def predictor_cost(self) -> PredictorCost | None:
        """What the predictor costs on this run's engine (None without a predictor)."""
        return self.predictor.cost(self.profile.hardware) if self.predictor is not None else None

    def run(self, steps: Callable[[Simulation, RequestTable, NoPrediction], StepRunner] | None = None) -> RunResult:
        """The run: its steps by this module's loop, or by the :class:`StepRunner` that ``steps`` makes
        for this run's request table and prediction driver (the compiled kernel's, which replays it)."""
        if self._ran:
            raise RuntimeError("a Simulation runs once (its predictor's online state is spent); build a new one")
        self._ran = True
        wl, n = self.workload, len(self.workload)
        table = RequestTable(wl, self.arrival, self.closed_loop)
        log = StepLog() if self.record_steps else None
        env = simpy.Environment()
        parts = build_parts(table, self.policy, self.predictor, self.predictor_cost, self.profile, self.config, env,
                            charge_cost=self.charge_cost, step_clock=self.step_clock, log=log)
        driver, scheduler = parts.driver, parts.scheduler
        state = {"steps": 0}
        compiled = steps(self, table, driver) if steps is not None else None
        if compiled is not None:
            env.process(compiled.step_process(env, self.progress))
        else:
            env.process(self._step_loop(env, parts, state))
        started = time.process_time()
        env.run()
        sim_cpu_s = time.process_time() - started
        if compiled is not None:
            table.finished = compiled.finished
            state["steps"] = compiled.steps
            if log is not None:
                compiled.fill_step_log(log)
        if table.finished != n:
            raise RuntimeError(f"simulation ended with {n - table.finished} unfinished requests")
        return RunResult(
            workload=wl, rows_request_id=wl.request_id, arrival_s=table.arrival, admit_s=table.admit_s,
            first_token_s=table.first_token_s, finish_s=table.finish_s, admit_step=table.admit_step,
            first_token_step=table.first_token_step, finish_step=table.finish_step, prompt_tokens=table.prompt,
            output_tokens=table.length, predicted_tokens=table.first_predicted, predicted_ready_s=table.ready_s,
            forced_steps=table.forced_steps, steps=state["steps"], gpu_s_charged=driver.gpu_s,
            predictor_cpu_s=driver.cpu_s, updates_published=driver.updates, sim_cpu_s=sim_cpu_s,
            step_log=log, output_kind=driver.output_kind,
            mae_in_use=driver.mae_in_use if compiled is None else compiled.mae_in_use,
            contended_steps=scheduler.contended if compiled is None else compiled.contended,
            preemptions=table.preemptions if self.config.kv_bounded else None,
            cached_tokens=(compiled.cached_tokens if compiled is not None else scheduler.kv.cached_tokens)
            if isinstance(scheduler.kv, PrefixKVBlocks) else None)

    def _step_loop(self, env: simpy.Environment, parts: EngineParts, state: dict):
        """Orchestrates the parts; every decision and every piece of state lives in them."""
        table, scheduler = parts.table, parts.scheduler
        n, progress = table.n, self.progress
        step = 0
        while table.finished < n:
            now = env.now
            arrived = table.arrived_by(now)
            if scheduler.idle(arrived):
                yield env.timeout(table.arrival[arrived] - now)   # idle only when nothing is waiting
                continue
            batch, duration = parts.begin(now, arrived, step)
            yield env.timeout(duration)
            parts.end(batch, step, now, duration, env.now)
            step += 1
            state["steps"] = step
            if progress is not None and (step & 1023) == 0:
                progress(table.finished, n)
