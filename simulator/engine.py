"""The engine: a SimPy discrete-event replay of one vLLM-like serving engine.

One SimPy process runs the step loop, one timeout per engine step; a second process is the CPU
worker that runs predictor updates (LEAP+RLS) off the critical path. Request state lives in
numpy arrays indexed by *row*; rows are numbered in (arrival time, trace row) order, which makes
"row order" the FCFS order and the final tie-break of every sort. Semantics:
``../shared/spec/simulator.md``.

A step = prefill of the requests admitted this step (their first output token) + one decode token
for up to ``decode_slots`` resident requests: first those forced by the wait cap, then the
policy's ranking. The true output length is read only to decide completion.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import simpy

from core.trace import Trace
from policies.base import Policy, SchedulerView
from policies.selection import choose_decodes
from predictors.base import PendingUpdate, Predictor
from simulator.profiles.base import EngineProfile

NOT_YET = np.nan


class SimulationStalled(RuntimeError):
    """A step with requests in the system admitted and decoded nothing: the run would never end."""


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits (defaults: the paper's vLLM setup)."""

    max_resident: int = 512
    decode_slots: int = 64
    prefill_token_budget: int = 8192
    kv_token_budget: int | None = None   # optional second admission limit, off by default
    wait_cap: int = 128                  # steps without a decode before a request is forced; 0 = off
    # vLLM V1 scheduling (both off by default; `--preset recorded` turns them on):
    chunked_prefill: bool = False        # a prompt longer than the budget left is prefilled in chunks
    decodes_in_budget: bool = False      # each decode takes one token of prefill_token_budget first

    def __post_init__(self) -> None:
        for name in ("max_resident", "decode_slots", "prefill_token_budget"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if not isinstance(self.wait_cap, (int, np.integer)) or self.wait_cap < 0:
            raise ValueError(f"wait-cap must be an integer >= 0, got {self.wait_cap!r}")
        for name in ("chunked_prefill", "decodes_in_budget"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name.replace('_', '-')} must be true or false")
        if self.kv_token_budget is not None and (
            not isinstance(self.kv_token_budget, (int, np.integer)) or self.kv_token_budget < 1
        ):
            raise ValueError(f"kv-budget must be a positive integer, got {self.kv_token_budget!r}")
        if self.kv_token_budget is not None and self.max_resident > self.kv_token_budget:
            raise ValueError(f"max-resident {self.max_resident} is above kv-budget {self.kv_token_budget} "
                             "(each resident request holds at least one KV token): lower --max-resident")


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
    predicted_decoded: list = field(default_factory=list)  # rows decoded (only with keep_rows)

    def as_arrays(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in asdict(self).items() if k != "predicted_decoded"}


@dataclass
class RunResult:
    """Everything a run produced; per-request arrays are in row order."""

    workload: Trace
    rows_request_id: np.ndarray
    arrival_s: np.ndarray
    admit_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
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

    @property
    def makespan_s(self) -> float:
        return float(np.nanmax(self.finish_s)) if len(self.finish_s) else 0.0


class Simulation:
    """One run: a workload with arrival times, a policy, a predictor, an engine profile."""

    def __init__(self, workload: Trace, arrival_s: np.ndarray, *, policy: Policy, predictor: Predictor | None,
                 profile: EngineProfile, config: EngineConfig = EngineConfig(), seed: int = 0,
                 charge_cost: bool = True, record_steps: bool = False,
                 progress: Callable[[int, int], None] | None = None, closed_loop: int | None = None):
        arrival_s = np.asarray(arrival_s, dtype=np.float64)
        if arrival_s.shape != (len(workload),):
            raise ValueError(f"need one arrival time per request ({len(workload)}), got {arrival_s.shape}")
        if not np.isfinite(arrival_s).all() or (arrival_s < 0).any():
            raise ValueError("arrival times must be finite and >= 0")
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
        self.seed, self.charge_cost, self.record_steps, self.progress = seed, charge_cost, record_steps, progress

    # ------------------------------------------------------------------ run
    def run(self) -> RunResult:
        wl, cfg = self.workload, self.config
        n = len(wl)
        self.prompt = wl.prompt_tokens.astype(np.int64)
        self.prompt_sq = self.prompt * self.prompt
        self.length = wl.output_tokens.astype(np.int64)        # completion only; never shown to policies
        self.generated = np.zeros(n, dtype=np.int64)
        self.predicted = np.zeros(n, dtype=np.float64)
        self.first_predicted = np.full(n, NOT_YET)
        self.in_use_abs_error, self.in_use_decodes = 0.0, 0
        self.ready_s = np.full(n, NOT_YET)
        self.admit_s = np.full(n, NOT_YET)
        self.first_token_s = np.full(n, NOT_YET)
        self.finish_s = np.full(n, NOT_YET)
        self.last_served = np.zeros(n, dtype=np.int64)
        self.forced_steps = np.zeros(n, dtype=np.int64)
        self.admitted = np.zeros(n, dtype=bool)
        self.resident = np.empty(0, dtype=np.int64)
        self.finished = 0
        self.step = 0
        self.gpu_s = 0.0
        self.gpu_debt = 0.0
        self.cpu_s = 0.0
        self.updates = 0
        self.kv_used = 0
        self.contended = 0
        self.prefilled = np.zeros(n, dtype=np.int64)   # prompt tokens computed (chunked prefill)
        self.partial = -1                              # row whose prompt is partly prefilled, if any
        self.released = min(self.closed_loop, n) if self.closed_loop is not None else n
        self.log = StepLog() if self.record_steps else None

        pred = self.predictor
        if pred is not None:
            pred.bind(wl, np.random.default_rng(self.seed))
            self.predicted[:] = pred.prior_length
        self.cost = pred.cost() if pred is not None else None
        self.arrival_scoring = pred is not None and pred.stage == "arrival"
        self.ordered_admission = self.arrival_scoring and self.policy.uses_predictions
        self.scored = 0  # rows [0, scored) have arrival-stage scores
        self.view = SchedulerView(now=0.0, arrival_s=self.arrival, predicted=self.predicted,
                                  generated=self.generated,
                                  output_kind=pred.output if pred is not None else "length",
                                  waiting=0, decode_slots=cfg.decode_slots, step=0,
                                  last_served=self.last_served, first_predicted=self.first_predicted)

        self.env = simpy.Environment()
        self.updates_store = simpy.Store(self.env)
        self.env.process(self._cpu_worker())
        self.env.process(self._step_loop())
        started = time.process_time()
        self.env.run()
        sim_cpu_s = time.process_time() - started
        if self.finished != n:
            raise RuntimeError(f"simulation ended with {n - self.finished} unfinished requests")
        return RunResult(
            workload=wl, rows_request_id=wl.request_id, arrival_s=self.arrival, admit_s=self.admit_s,
            first_token_s=self.first_token_s, finish_s=self.finish_s, prompt_tokens=self.prompt,
            output_tokens=self.length, predicted_tokens=self.first_predicted, predicted_ready_s=self.ready_s,
            forced_steps=self.forced_steps, steps=self.step, gpu_s_charged=self.gpu_s,
            predictor_cpu_s=self.cpu_s, updates_published=self.updates, sim_cpu_s=sim_cpu_s,
            step_log=self.log, output_kind=pred.output if pred is not None else "length",
            mae_in_use=self.in_use_abs_error / self.in_use_decodes if self.in_use_decodes else None,
            contended_steps=self.contended)

    # ------------------------------------------------------------------ predictor plumbing
    def _set_predictions(self, rows: np.ndarray, values: np.ndarray, now: float) -> None:
        self.predicted[rows] = values
        fresh = rows[np.isnan(self.first_predicted[rows])]
        if len(fresh):
            self.first_predicted[fresh] = self.predicted[fresh]
            self.ready_s[fresh] = now

    def _score_arrivals(self, arrived: int) -> None:
        """Arrival-stage predictors score new arrivals before the step; the GPU pays next step."""
        rows = np.arange(self.scored, arrived)
        self.scored = arrived
        self._set_predictions(rows, self.predictor.predict(rows), self.env.now)
        if self.charge_cost:
            self.gpu_debt += self.cost.gpu_s(len(rows), int(self.prompt[rows].sum()))

    def _predict_after_prefill(self, rows: np.ndarray, start: float, duration: float) -> None:
        """Hidden-state predictors: the feature exists once prefill reaches the tapped layer."""
        cpu = (self.cost.cpu_s_per_prediction if self.charge_cost else 0.0) * len(rows)  # one core, in turn
        self.cpu_s += cpu
        ready = start + self.cost.tap_fraction * duration + cpu
        end = start + duration
        if ready <= end:
            self._set_predictions(rows, self.predictor.predict(rows), end)
            return
        event = self.env.timeout(ready - end)
        event.callbacks.append(lambda _e, rows=rows: self._set_predictions(
            rows, self.predictor.predict(rows), self.env.now))

    def _cpu_worker(self):
        """Runs online-learning updates one after another; publishes each when it completes."""
        while True:
            update: PendingUpdate = yield self.updates_store.get()
            cpu = update.cpu_s if self.charge_cost else 0.0
            self.cpu_s += cpu
            if cpu > 0:
                yield self.env.timeout(cpu)
            update.publish()
            self.updates += 1
            rescored = self.resident[~np.isnan(self.ready_s[self.resident])]
            if len(rescored):
                self._set_predictions(rescored, self.predictor.predict(rescored), self.env.now)

    # ------------------------------------------------------------------ the step loop
    def _admit(self, arrived: int, budget: int) -> np.ndarray:
        cfg = self.config
        room = cfg.max_resident - len(self.resident) - (self.partial >= 0)
        if budget <= 0:
            return np.empty(0, dtype=np.int64)
        lo = self._admit_ptr
        if room <= 0 or lo >= arrived:
            return np.empty(0, dtype=np.int64)
        if self.ordered_admission:
            cand = lo + np.flatnonzero(~self.admitted[lo:arrived])
            keys = self.policy.admission_keys(self.view, cand)
            if keys is not None:
                cand = cand[np.argsort(keys, kind="stable")]
        else:
            cand = np.arange(lo, min(arrived, lo + room))
        cand = cand[:room]
        tokens = np.cumsum(self.prompt[cand])
        # strict order: stop at the first request that does not fit; an over-long prompt goes alone
        take = int(np.searchsorted(tokens, budget, side="right"))
        if cfg.chunked_prefill:   # the next one gets what budget is left, as a first chunk
            take += int(take < len(cand) and (tokens[take - 1] if take else 0) < budget)
        else:
            take = max(take, 1)
        if cfg.kv_token_budget is not None:
            fits = int(np.searchsorted(tokens, cfg.kv_token_budget - self.kv_used, side="right"))
            take = min(take, fits if fits or len(self.resident) else 1)  # an empty engine admits one
        rows = cand[:take]
        if len(rows):
            self.admitted[rows] = True
            self.n_admitted += len(rows)
            while self._admit_ptr < arrived and self.admitted[self._admit_ptr]:
                self._admit_ptr += 1
        return rows

    def _choose_decodes(self, ready: np.ndarray) -> tuple[np.ndarray, int]:
        cfg = self.config
        return choose_decodes(self.policy, self.view, ready, decode_slots=cfg.decode_slots,
                              wait_cap=cfg.wait_cap, step=self.step, last_served=self.last_served)

    def _step_loop(self):
        env, cfg, n = self.env, self.config, len(self.workload)
        self._admit_ptr = 0
        self.n_admitted = 0
        arrival, prompt, prompt_sq = self.arrival, self.prompt, self.prompt_sq
        generated, length, last_served = self.generated, self.length, self.last_served
        pred, profile, log = self.predictor, self.profile, self.log
        prefill_predictor = pred is not None and pred.stage == "prefill"
        refresh_every = pred.refresh_every if pred is not None else None
        track_error = pred is not None and pred.output == "length"
        while self.finished < n:
            now = env.now
            arrived = int(np.searchsorted(arrival, now, side="right"))
            if len(self.resident) == 0 and self.partial < 0 and self._admit_ptr >= arrived:
                yield env.timeout(arrival[arrived] - now)   # idle only when nothing is waiting
                continue
            if self.arrival_scoring and self.scored < arrived:
                self._score_arrivals(arrived)
            view = self.view
            view.now = now
            view.step = self.step
            view.waiting = arrived - self.n_admitted
            ready = self.resident
            chosen, n_forced = self._choose_decodes(ready)
            budget = cfg.prefill_token_budget - (len(chosen) if cfg.decodes_in_budget else 0)
            carried = self.partial
            carried_chunk = 0
            if carried >= 0:   # a partly prefilled prompt continues before new admissions
                carried_chunk = int(min(prompt[carried] - self.prefilled[carried], max(budget, 0)))
                budget -= carried_chunk
            admit = self._admit(arrived, budget)
            if not len(admit) and not len(chosen) and not carried_chunk:
                raise SimulationStalled(
                    f"step {self.step} at t={now:.6g} s admitted and decoded nothing with "
                    f"{len(ready)} resident and {arrived - self.n_admitted} waiting requests "
                    f"(decode_slots={cfg.decode_slots}, max_resident={cfg.max_resident})")
            # the policy chose: more ready requests than decode slots, or (policy-ordered
            # admission) requests left waiting
            if len(ready) > cfg.decode_slots or (self.ordered_admission and arrived - self.n_admitted > 0):
                self.contended += 1
            if track_error and len(chosen):   # error of the estimate each decoded request is scheduled on
                self.in_use_abs_error += float(np.abs(self.predicted[chosen] - length[chosen]).sum())
                self.in_use_decodes += len(chosen)

            if cfg.chunked_prefill:
                chunks = np.minimum(prompt[admit], np.maximum(budget - np.concatenate(
                    [[0], np.cumsum(prompt[admit])[:-1]]), 0)) if len(admit) else np.empty(0, dtype=np.int64)
                before = int(self.prefilled[carried]) if carried >= 0 else 0
                prefill_tokens = carried_chunk + int(chunks.sum())
                prefill_sq = carried_chunk * (before + carried_chunk) + int((chunks * chunks).sum())
                self.prefilled[admit] = chunks
                if carried >= 0:
                    self.prefilled[carried] += carried_chunk
                first = admit[chunks == prompt[admit]]
                if carried >= 0 and self.prefilled[carried] == prompt[carried]:
                    first = np.concatenate([[carried], first]).astype(np.int64)
                    self.partial = -1
                if len(admit) and chunks[-1] < prompt[admit[-1]]:
                    self.partial = int(admit[-1])
            else:
                first = admit
                prefill_tokens = int(prompt[admit].sum()) if len(admit) else 0
                prefill_sq = int(prompt_sq[admit].sum()) if len(admit) else 0
            context = int(prompt[chosen].sum() + generated[chosen].sum())
            duration = profile.step_time(prefill_tokens, prefill_sq, len(chosen), context)
            charge = self.gpu_debt
            self.gpu_debt = 0.0
            if prefill_predictor and self.charge_cost and len(admit):
                charge += self.cost.gpu_s(len(admit), prefill_tokens)
            duration += charge
            self.gpu_s += charge
            if log is not None:
                log.start_s.append(now)
                log.duration_s.append(duration)
                log.admitted.append(len(admit))
                log.decoded.append(len(chosen))
                log.forced.append(n_forced)
                log.ready.append(len(ready))
                log.resident.append(len(ready) + len(admit) + (carried >= 0))   # a carried chunk holds a place
                log.arrived.append(arrived)
                log.capacity_left.append(cfg.max_resident - len(ready) - len(admit) - (carried >= 0))
                log.waiting.append(view.waiting - len(admit))
            yield env.timeout(duration)
            end = env.now

            # decode tokens and first tokens land at the end of the step
            generated[chosen] += 1
            last_served[chosen] = self.step
            self.forced_steps[chosen[:n_forced]] += 1
            self.kv_used += len(chosen)
            done = chosen[generated[chosen] >= length[chosen]]
            if len(admit):
                self.admit_s[admit] = now
            self.kv_used += prefill_tokens
            if len(first):   # prompts completed this step emit their first token
                self.first_token_s[first] = end
                generated[first] = 1
                last_served[first] = self.step
                self.kv_used += len(first)
                if prefill_predictor:
                    self._predict_after_prefill(first, now, duration)
                elif pred is not None:
                    observed = pred.after_prefill(first)
                    if observed is not None:
                        self._set_predictions(first, observed, end)
                        if self.charge_cost:
                            self.gpu_debt += self.cost.gpu_s_per_refresh * len(first)
                one_token = first[length[first] <= 1]
                if len(one_token):
                    done = np.concatenate([done, one_token])
            if refresh_every:
                due = chosen[(generated[chosen] % refresh_every == 0) & (generated[chosen] < length[chosen])]
                if len(due):
                    self._set_predictions(due, pred.refresh(due, generated[due]), end)
                    if self.charge_cost:
                        self.gpu_debt += self.cost.gpu_s_per_refresh * len(due)
            resident = self.resident
            if len(done):
                self.finish_s[done] = end
                self.finished += len(done)
                self.kv_used -= int(prompt[done].sum() + length[done].sum())
                keep = np.isnan(self.finish_s[resident])
                resident = resident[keep]
            if len(first):
                resident = np.concatenate([resident, first[np.isnan(self.finish_s[first])]])
                if self.ordered_admission:
                    resident.sort(kind="stable")
            self.resident = resident
            if self.released < n and len(done):   # closed loop: each completion submits the next row
                fresh = min(len(done), n - self.released)
                arrival[self.released:self.released + fresh] = end
                self.released += fresh
            if log is not None:
                log.finished.append(self.finished)
            if len(done) and pred is not None:
                update = pred.feedback(done, length[done])
                if update is not None:
                    self.updates_store.put(update)
            self.step += 1
            if self.progress is not None and (self.step & 1023) == 0:
                self.progress(self.finished, n)
