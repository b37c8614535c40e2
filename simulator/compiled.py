"""The compiled step: the engine's step loop as one numba kernel, Python only between its steps.

The reference engine (:mod:`simulator.engine`) stays the definition; this kernel replays it with the same
float64 arithmetic in the same order, so its outputs are byte-identical (the identity tests in
``tests/test_compiled.py`` hold it to that). It covers every predictor: no predictor, the oracles
(estimates fixed at bind time, inside the kernel), arrival-stage predictors scored in Python when rows
arrive, prefill-stage predictors predicted in Python after each prefilling step (estimates fixed per row
at bind time, frozen ``leap`` and ``egtp``, are published in compiled code instead:
:mod:`simulator.kernel_estimates`), re-estimates after prefill and during decode (TRAIL, LEAP with
refresh) made in Python after the step that calls for them (TRAIL's arrival scores, prefill probe and
refreshes in compiled code instead: :mod:`simulator.kernel_trail`), and online learning (LEAP+RLS): the
kernel buffers finished rows until a feedback batch is due, Python runs the predictor's feedback, and the
CPU worker's publishes fire between compiled steps (LEAP+RLS's prefill estimates from the live weights
made in compiled code: :mod:`simulator.kernel_online`). Policies FCFS, countdown and TRAIL's limited
preemption (its locked rows merged into the (key, row) order at their key, -inf: first whatever a rank
predictor's scores are), SSJF's starvation override (a starving decision by arrival), aging (keys re-made
when its clock ticks) and LTR's starvation rule (both :mod:`simulator.kernel_policies`); the roofline /
fitted / unit profiles; chunked prefill, the KV budget, KV blocks (:mod:`simulator.kernel_kv`) and
their prefix caching (:mod:`simulator.kernel_prefix`; not for a policy that reads the cached tokens), the step clock and closed loop, with every
predictor; the step log (``record_steps``: :mod:`simulator.kernel_log`, :mod:`simulator.compiled_log`). It
is ``simulate``'s default kernel. A policy without a compiled form runs on the reference engine, and
:func:`unsupported` says why (one line per process). Without numba every run uses the reference.

Events between steps (an estimate ready after its step ended, an online update's publish) keep
SimPy's order: by time, then creation. The kernel counts the step loop's timeouts (steps and idle
waits), and each event remembers how many were created before it, so an event at exactly a step's
end fires before that step lands only if it was created before the step began, as in SimPy.
Python then fires it against the system as it was before the landing (residents, finished count,
arrived count). The reference publishes a prefill's estimates in ``after_step``, before the step's
``retire``, so they too see the system before the landing: in a closed loop the rows that the
step's completions submit (at its end) have not arrived yet (``BATCH.n_released`` counts them).

The kernel itself is :mod:`simulator.kernel`; this module decides when it applies, runs the
predictor's side between its calls, and is the SimPy process around it
(:meth:`CompiledRun.step_process`), which advances the simulated clock per chunk of steps.
"""

from __future__ import annotations

import functools
import heapq
import multiprocessing
import os
import sys

import numpy as np

from policies.rule import params_array
from predictors.base import Known
from simulator.compiled_log import fill_step_log, no_log, with_room
from simulator.kernel import DEFAULT_RULE, announce_compile, first_call, load_kernel
from simulator.kernel_estimates import C_CPU_SPENT, load_publishing_kernel, publish_cost
from simulator.kernel_float import profile_coefficients
from simulator.kernel_kv import kv_arrays, kv_fill
from simulator.kernel_layout import (
    AFTER_STEP,
    BATCH,
    KEY_REMAINING,
    KEY_ROW,
    KEY_SCORE,
    NEEDS_EVENT,
    NEEDS_SCORES,
    PRED_NONE,
    PRED_PREFILL,
    PRED_PYTHON,
    PRED_STATIC,
    REKEY_RESORT,
    STATE,
    Rows,
    Settings,
    Work,
    new_record,
    record,
)
from simulator.kernel_online import advance_online, compiled_online
from simulator.kernel_prefix import prefix_arrays
from simulator.kernel_trail import advance_trail, compiled_trail
from simulator.prediction import refresh_due
from simulator.prefix_cache import BlockKeys

KERNELS = ("reference", "compiled")
DEFAULT_KERNEL = "compiled"      # simulate's, RunConfig's and leap-validate's replays' (Simulation.run's: the reference)
CHUNK_STEPS = 1 << 16            # steps per kernel call (progress reports between calls)


def unsupported(sim) -> str | None:
    """Why the compiled kernel cannot replay ``sim`` exactly (None: it can). Reads what the policy,
    predictor and profile declare (``compiled`` with ``why_not``, ``compiled_form``, ``compiled_coefficients``)."""
    if load_kernel() is None:
        return "numba is missing or fails to load"
    policy, p = sim.policy, sim.predictor
    if sim.config.caches_prefixes and policy.reads_cached:
        return (f"policy {policy.name!r} reads the cached prompt tokens, which the kernel does not serve a policy; "
                "--prefix-caching off runs compiled")
    if not policy.compiled:
        from policies import POLICIES
        compiled = ", ".join(n for n, c in POLICIES.items() if c.compiled)
        why = policy.why_not.get("compiled", "it declares no compiled form")
        return f"policy {policy.name!r} is not compiled: {why} ({compiled} are)"
    if p is not None and not p.compiled:
        return f"predictor {p.name!r} is not compiled: {p.why_not.get('compiled', 'it declares so')}"
    if sim.config.kv_bounded and not policy.kernel_victims:
        return f"policy {policy.name!r} declares its own KV victim rule (victim_keys): the kernel's is the decode order"
    form = policy.compiled_form()
    if form is None:
        raise TypeError(f"policy {policy.name!r} declares compiled but its compiled_form() is None")
    if not form.rank_predictors and p is not None and p.output == "rank":
        return f"{sim.policy.name} with a rank predictor is not compiled (its compiled form takes no rank scores)"
    if sim.profile.compiled_coefficients() is None:
        return f"engine profile {sim.profile.name!r} is not compiled"
    return None


#: Set by a command that has said every fallback of its runs itself (``simulate`` checks them all
#: before it starts workers): its worker processes inherit it and stay quiet, so a note shows once.
NOTED_ENV = "LEAP_KERNEL_FALLBACKS_NOTED"


@functools.cache
def note_fallback(reason: str) -> None:
    """Say once per process and reason that ``--kernel compiled`` ran the reference engine."""
    if multiprocessing.parent_process() is not None and os.environ.get(NOTED_ENV) == "1":
        return
    print(f"--kernel compiled: {reason}; uses the reference engine", file=sys.stderr)


class CompiledRun:
    """One run's compiled state over a :class:`simulator.requests.RequestTable` (its arrays are
    written in place, so the run's result is read from the table as the reference engine's is)."""

    def __init__(self, sim, table, driver, fast_paths: bool = True):   # fast_paths off: a fleet's replica
        # (its rows' block keys are written as they are routed: simulator.kernel_prefix.add_row_keys)
        self.table, cfg, n = table, sim.config, table.n
        self.predictor, self.driver = sim.predictor, driver
        self.has_pred = sim.predictor is not None
        self.track_error = self.has_pred and sim.predictor.output == "length"
        if not self.has_pred:
            self.mode, self.predicted = PRED_NONE, np.zeros(n, dtype=np.float64)
        elif sim.predictor.static_estimates:   # estimates fixed per row at bind time
            self.mode = PRED_STATIC
            self.predicted = np.ascontiguousarray(
                sim.predictor.predict(np.arange(n), Known(arrived=0, finished=0)), dtype=np.float64)
        elif sim.predictor.stage == "arrival":   # scored in Python when rows arrive (score_arrivals)
            self.mode, self.predicted = PRED_PYTHON, table.predicted
        else:   # predicted in Python once a prompt is prefilled (PredictionDriver._predict_after_prefill)
            self.mode, self.predicted = PRED_PREFILL, table.predicted
        self.rekey = np.empty(max(n, REKEY_RESORT) + 1, dtype=np.int64)
        # SimPy events between steps (delayed estimates, online-update publishes), in SimPy's order:
        # (time, creation); each also keeps how many step-loop timeouts were created before it
        self.pending: list[tuple[float, int, int, object]] = []   # (time, creation, step-loop yields, what)
        self.events = 0
        self.worker_queue: list = []          # online updates waiting for the CPU worker
        self.worker_busy = False
        self.cfg = cfg
        self.step_clock = sim.step_clock
        self.fb_batch = sim.predictor.feedback_batch if self.has_pred and sim.predictor.learns_online else 0
        self.refresh_every = (sim.predictor.refresh_every or 0) if self.has_pred else 0
        self.after_prefill = self.mode == PRED_PYTHON and sim.predictor.observes_prefill
        self.rows = Rows(table.arrival, table.prompt, table.length, self.predicted, table.generated,
                         table.last_served, table.forced_steps, table.admitted, table.admit_s, table.first_token_s,
                         table.finish_s, table.admit_step, table.first_token_step, table.finish_step,
                         table.first_predicted, table.ready_s, table.prefilled, table.attributes,
                         params_array(sim.policy.compiled_form().params), np.zeros(n, dtype=np.int64),
                         kv_fill(table, cfg.kv_bounded), table.preemptions)
        self.keys = BlockKeys(table, cfg.kv_block_size) if cfg.caches_prefixes else None   # each row's block keys
        self.fast_paths = fast_paths
        self.work = self._work_arrays(n, sim.policy)
        self.settings = self._settings(sim)
        self.state, self.batch = new_record(STATE), new_record(BATCH)   # what the kernel takes
        self.st, self.last = record(self.state), record(self.batch)     # Python's named view of them
        self.st.partial = -1
        self.st.released = table.released
        self.st.lru_head = self.st.lru_tail = -1
        self.st.pk_head, self.st.pk_tail = (0, int(cfg.kv_blocks_total) - 1) if self.keys is not None else (-1, -1)
        self.st.next_event = self.st.until = np.inf
        self.kernel_args = (self.rows, self.work, self.settings, self.state, self.batch)
        # the policy's rule compiled in; the predictors' compiled stops are built on the default rule's kernel
        self.rule = sim.policy.compiled_form().rule or DEFAULT_RULE
        own_rule = self.rule != DEFAULT_RULE or not fast_paths   # TRAIL's, LEAP's stops index the workload's rows
        self.publishing = None if own_rule else self._fixed_estimates_publisher(sim)
        self.trail = None if own_rule else compiled_trail(self, sim)   # TRAIL's Python stops done in compiled code
        self.online = compiled_online(self, sim) if self.fb_batch and not own_rule else None   # LEAP+RLS's prefill estimates
        self.advance(0)   # compiles the kernel or loads it from the cache, before the run's clock starts

    def _work_arrays(self, n: int, policy) -> Work:
        """The kernel's working arrays, sized once for the run (written in place every call)."""
        width = max(self.cfg.max_resident, self.cfg.decode_slots) + 1
        rows, wide = max(n, 1), np.empty(width, dtype=np.int64)
        # LTR's per-row state: the policy's own arrays, reset for this run (so both kernels end with it)
        no_state = np.empty(0, dtype=np.int64)
        promotes = policy.compiled_form().promote_after_idle is not None
        runs_left, served_seen, first_waiting = ((policy.runs_left, policy.served_seen, policy.first_waiting)
                                                 if promotes else (no_state, no_state, no_state))
        return Work(resident=wide, ord_rows=np.empty(width + 1, dtype=np.int64),
                    ord_keys=np.empty(width + 1, dtype=np.float64),
                    lru_prev=np.empty(rows, dtype=np.int64), lru_next=np.empty(rows, dtype=np.int64),
                    heap_keys=np.empty(rows, dtype=np.float64), heap_rows=np.empty(rows, dtype=np.int64),
                    chosen=np.empty(width, dtype=np.int64), admit=np.empty(width, dtype=np.int64),
                    firsts=np.empty(width + 1, dtype=np.int64), done_rows=np.empty(2 * width + 2, dtype=np.int64),
                    scratch=np.empty(width, dtype=np.int64), err=np.empty(width, dtype=np.float64),
                    pair_stack=np.zeros((3, 64), dtype=np.int64), pair_sums=np.empty(64, dtype=np.float64),
                    rekey=self.rekey, fb_rows=np.empty(rows, dtype=np.int64), fb_ends=np.empty(rows, dtype=np.int64),
                    runs_left=runs_left, served_seen=served_seen, first_waiting=first_waiting,
                    **kv_arrays(n if self.cfg.kv_bounded else 0, width),
                    **prefix_arrays(self.table, self.cfg, self.keys, routed=not self.fast_paths), **no_log())

    def _settings(self, sim) -> Settings:
        """The run's fixed settings as the kernel reads them (the policy's and profile's declared forms)."""
        cfg, form = self.cfg, sim.policy.compiled_form()
        keys_on = (KEY_ROW if form.keys == "row"
                   else KEY_SCORE if sim.predictor is not None and sim.predictor.output == "rank" else KEY_REMAINING)
        kind, ints, floats = profile_coefficients(sim.profile)
        cost = self.driver.cost if self.mode == PRED_PREFILL else None
        return Settings(
            pred_mode=self.mode, ordered=bool(self.has_pred and sim.predictor.stage == "arrival"
                                              and sim.policy.uses_predictions),
            keys_on=keys_on, lock_after=float(form.lock_after) if form.lock_after is not None else -1.0,
            starvation_override=form.starve_after_s is not None,
            starve_after_s=float(form.starve_after_s) if form.starve_after_s is not None else 0.0,
            starve_factor=float(form.starve_factor), exec_base_s=float(form.exec_base_s),
            exec_per_token_s=float(form.exec_per_token_s),
            decode_slots=int(cfg.decode_slots), wait_cap=int(cfg.wait_cap),
            prefill_budget=int(cfg.prefill_token_budget), decodes_in_budget=bool(cfg.decodes_in_budget),
            kv_budget=-1 if cfg.kv_token_budget is None else int(cfg.kv_token_budget),
            max_resident=int(cfg.max_resident), chunked=bool(cfg.chunked_prefill), step_clock=bool(self.step_clock),
            profile_kind=kind, profile_ints=ints, profile_floats=floats,
            charge_prefill=bool(cost is not None and self.driver.charge_cost),
            charge_per_call=float(cost.gpu_s_per_call) if cost is not None else 0.0,
            charge_per_request=float(cost.gpu_s_per_request) if cost is not None else 0.0,
            charge_per_prompt_token=float(cost.gpu_s_per_prompt_token) if cost is not None else 0.0,
            feedback_batch=int(self.fb_batch), refresh_every=int(self.refresh_every),
            after_prefill=bool(self.after_prefill), aging=form.aging_log_rate is not None, keys_rise=form.keys_rise,
            aging_log_rate=float(form.aging_log_rate or 0.0), aging_every_s=float(form.aging_every_s),
            promotes=form.promote_after_idle is not None, promote_after_idle=int(form.promote_after_idle or 0),
            promoted_runs=int(form.promoted_runs), record_steps=bool(sim.record_steps),
            kv_total=int(cfg.kv_blocks_total) if cfg.kv_bounded else 0,
            kv_size=int(cfg.kv_block_size) if cfg.kv_bounded else 1, kv_caches=self.keys is not None)

    def _fixed_estimates_publisher(self, sim) -> tuple | None:
        """(estimates, source rows (the identity), cost) for :mod:`simulator.kernel_estimates` when a prefill-stage predictor's
        estimates are fixed per row and it neither refreshes nor learns; else None."""
        fixed = self.predictor.fixed_estimates() if self.mode == PRED_PREFILL else None
        if fixed is None or self.refresh_every or self.fb_batch:
            return None
        return (np.ascontiguousarray(fixed, dtype=np.float64), np.arange(len(fixed), dtype=np.int64),
                publish_cost(self.driver))

    def advance(self, max_steps: int) -> int:
        """Up to ``max_steps`` compiled steps (the step log grown first to hold them all)."""
        if self.settings.record_steps:
            self.work = with_room(self.work, self.steps + max_steps)
            self.kernel_args = (self.rows, self.work, self.settings, self.state, self.batch)
        if self.trail is not None:
            return advance_trail(self, max_steps, self.trail)
        if self.online is not None:
            return advance_online(self, max_steps, self.online)
        if self.publishing is None:
            announce_compile()   # once: the first call compiles unless numba's cache holds it
            return int(first_call(load_kernel(self.rule), self.rule, max_steps, *self.kernel_args))
        estimates, source, cost = self.publishing
        cost[C_CPU_SPENT] = self.driver.cpu_s
        done = first_call(load_publishing_kernel(), DEFAULT_RULE, max_steps, estimates, source, cost, *self.kernel_args)
        self.driver.cpu_s = float(cost[C_CPU_SPENT])
        return int(done)

    def fill_step_log(self, log) -> None:
        """The run's step log into ``log`` (a :class:`simulator.engine.StepLog`), as the reference keeps it."""
        fill_step_log(log, self.work, self.steps)

    @property
    def cached_tokens(self) -> np.ndarray | None:
        """Per row, prompt tokens found cached at its first admission (prefix caching; else None)."""
        return self.work.pk_cached if self.keys is not None else None

    @property
    def now(self) -> float:
        return float(self.st.now)

    @property
    def finished(self) -> int:
        return int(self.st.finished)

    @property
    def steps(self) -> int:
        return int(self.st.step)

    @property
    def contended(self) -> int:
        return int(self.st.contended)

    @property
    def mae_in_use(self) -> float | None:
        decodes = int(self.st.decodes)
        return float(self.st.abs_error) / decodes if self.track_error and decodes else None

    def score_arrivals(self) -> None:
        """PredictionDriver.score_arrivals at the kernel's clock: rows that arrived since the last
        step are scored with what the system knows now; the GPU pays in the next step."""
        t, d = self.table, self.driver
        arrived, now = int(self.st.arrived), self.now
        rows = np.arange(int(self.st.py_scored), arrived)
        t.finished = self.finished
        t.set_predictions(rows, self.predictor.predict(rows, Known(arrived=arrived, finished=t.finished)), now)
        if d.charge_cost:   # the GPU debt the next step pays (kernel: STATE.charge, then STATE.gpu_s)
            self.st.charge += d.cost.gpu_s(len(rows), int(t.prompt[rows].sum()))
        self.st.py_scored = arrived

    def _publish(self, rows: np.ndarray, at: float, finished: int, before_landing: bool) -> None:
        """Estimates for ``rows`` usable from ``at`` (the predictor sees what the system knows then);
        the kernel re-sorts them on its next call. ``before_landing``: the system as it was before
        the kernel's last step retired its rows (the reference's ``after_step`` runs before
        ``retire``), so the rows its completions submitted in a closed loop have not arrived yet."""
        if not len(rows):
            return
        arrived = self.table.arrived_by(at)
        if before_landing:
            arrived = min(arrived, int(self.st.released) - int(self.last.n_released))
        known = Known(arrived=arrived, finished=finished)
        self._set_estimates(rows, self.predictor.predict(rows, known), at)

    def _set_estimates(self, rows: np.ndarray, values: np.ndarray, at: float) -> None:
        self.table.set_predictions(rows, values, at)
        k = int(self.st.n_rekey)
        if k + len(rows) > len(self.rekey):   # more than the list holds: the kernel re-sorts them all
            self.st.n_rekey = len(self.rekey)
            return
        self.rekey[k:k + len(rows)] = rows
        self.st.n_rekey = k + len(rows)

    def _schedule(self, at: float, yields_before: int, what) -> None:
        heapq.heappush(self.pending, (at, self.events, yields_before, what))
        self.events += 1
        self._next_event()

    def _next_event(self) -> None:
        at, _, yields_before, _ = self.pending[0] if self.pending else (np.inf, 0, 0, None)
        self.st.next_event, self.st.next_yields_before = at, yields_before

    def predict_after_prefill(self) -> None:
        """PredictionDriver._predict_after_prefill for the step the kernel just ran."""
        d = self.driver
        rows = self.work.firsts[:int(self.last.n_first)].copy()
        start, duration = float(self.last.start), float(self.last.duration)
        cpu = (d.cost.cpu_s_per_prediction if d.charge_cost else 0.0) * len(rows)   # one core, in turn
        d.cpu_s += cpu
        ready = start + d.cost.tap_fraction * duration + cpu
        end = start + duration
        if ready <= end:
            self._publish(rows, end, self.finished - int(self.last.n_done), before_landing=True)
            return
        # a SimPy timeout created before the step loop's next one
        self._schedule(end + (ready - end), int(self.st.yields), rows)

    def feed_back(self) -> None:
        """PredictionDriver.feedback for each step whose finished rows the kernel buffered (in step
        order); an update goes to the CPU worker at the end of the step that returned it."""
        ends = self.work.fb_ends[:int(self.st.fb_groups)].tolist()
        lo = 0
        for hi in ends:
            done = self.work.fb_rows[lo:hi].copy()
            lo = hi
            update = self.predictor.feedback(done, self.table.length[done])
            if update is not None and self.step_clock:   # PredictionDriver.publish_at_once
                self._publish_update(update, self.now, self.finished, self.work.resident[:int(self.st.n_res)],
                                     before_landing=False)
            elif update is not None:
                self.worker_queue.append(update)
        self.st.fb_n = self.st.fb_groups = 0
        if self.worker_queue and not self.worker_busy:
            # the worker's get fires after the step loop's next timeout (it waits on the update store)
            self._start_update(self.now, int(self.st.yields) + 1)

    def _start_update(self, at: float, yields_before: int) -> None:
        """PredictionDriver._cpu_worker takes the next update: CPU time, then the publish."""
        d = self.driver
        update = self.worker_queue.pop(0)
        cpu = update.cpu_s if d.charge_cost else 0.0
        d.cpu_s += cpu
        self.worker_busy = True
        self._schedule(at + cpu if cpu > 0 else at, yields_before, update)

    def _fire(self, at: float, what, before_landing: bool) -> None:
        """One event at ``at``; ``before_landing``: it fired while the kernel's last step was running
        (the kernel has landed it since), so the predictor sees the system as it was then."""
        done_last = int(self.last.n_done) if before_landing else 0
        finished = self.finished - done_last
        if isinstance(what, np.ndarray):   # a delayed estimate
            self._publish(what, at, finished, before_landing)
            return
        resident = self.work.resident[:int(self.st.n_res)]
        if done_last or (before_landing and (self.last.n_first or self.last.n_resumed)):   # before that step landed
            joined = np.concatenate([self.work.firsts[:int(self.last.n_first)],
                                     self.work.resumed[:int(self.last.n_resumed)]])
            resident = np.setdiff1d(np.union1d(resident, self.work.done_rows[:done_last]), joined)
        self._publish_update(what, at, finished, resident, before_landing)
        self.worker_busy = False
        if self.worker_queue:   # the worker's next get fires after any step-loop timeout created by now
            yields = int(self.st.yields)
            self._start_update(at, yields + (1 if at == self.now else 0))

    def _publish_update(self, update, at: float, finished: int, resident: np.ndarray, before_landing: bool) -> None:
        """PredictionDriver._publish: an online update's weights go live at ``at``; every resident
        request with an estimate is re-scored."""
        update.publish()
        self.driver.updates += 1
        rescored = resident[~np.isnan(self.table.ready_s[resident])]
        self._publish(rescored, at, finished, before_landing)

    def fire_due(self) -> None:
        """Events that fired before the step loop resumed at the kernel's clock, in SimPy's order."""
        now, yields = self.now, int(self.st.yields)
        while self.pending and (self.pending[0][0] < now or (self.pending[0][0] == now
                                                              and self.pending[0][2] < yields)):
            at, _, _, what = heapq.heappop(self.pending)
            self._fire(at, what, before_landing=True)
        self._next_event()

    def observe_prefill(self) -> None:
        """An arrival-stage predictor's estimates from the prefill just done (TRAIL's probe); the GPU
        pays a refresh per row in the next step (PredictionDriver.after_step)."""
        d, first = self.driver, self.work.firsts[:int(self.last.n_first)].copy()
        observed = self.predictor.after_prefill(first)
        if observed is not None:
            self._set_estimates(first, observed, self.now)
            if d.charge_cost:
                self.st.charge += d.cost.gpu_s_per_refresh * len(first)

    def refresh(self) -> None:
        """Decode-time re-estimates of the rows just decoded to a multiple of ``refresh_every``
        tokens and not finished (PredictionDriver.after_step)."""
        d, t = self.driver, self.table
        due = refresh_due(t, self.work.chosen[:int(self.last.n_chosen)], self.refresh_every)
        if len(due):
            self._set_estimates(due, self.predictor.refresh(due, t.generated[due]), self.now)
            if d.charge_cost:
                self.st.charge += d.cost.gpu_s_per_refresh * len(due)

    def after_step(self) -> None:
        """Python's part of the step the kernel just landed, in the reference's order: events that
        fired while it ran, estimates from its prefill, feedback from its finished rows."""
        self.fire_due()
        if self.mode == PRED_PREFILL and self.last.n_first:
            self.predict_after_prefill()
        elif self.after_prefill and self.last.n_first:
            self.observe_prefill()
        if self.refresh_every:
            self.refresh()
        if self.fb_batch and self.st.fb_n >= self.fb_batch:
            self.feed_back()

    def step_process(self, env, progress=None):
        """The SimPy process: a chunk of compiled steps, then the simulated clock catches up."""
        n = self.table.n
        while self.finished < n:
            self.advance(CHUNK_STEPS)
            status = self.st.status
            if status == NEEDS_SCORES:
                yield env.timeout(max(self.now - env.now, 0.0))
                self.score_arrivals()
                continue
            if status == AFTER_STEP:
                self.after_step()
                continue
            if status == NEEDS_EVENT:
                yield env.timeout(max(self.now - env.now, 0.0))
                self.fire_due()
                continue
            if self.st.status:
                raise self.stalled()
            yield env.timeout(max(self.now - env.now, 0.0))
            if progress is not None:
                progress(self.finished, n)
        self.finish()

    def stalled(self) -> Exception:
        """The :class:`simulator.scheduler.SimulationStalled` of the kernel's stall (:func:`simulator.compiled_stall.stalled`)."""
        from simulator.compiled_stall import stalled

        return stalled(self)

    def finish(self) -> None:
        """After the last step: the GPU charged, then what SimPy runs after it (events, the last feedback)."""
        self.driver.gpu_s = float(self.st.gpu_s) if self.has_pred else self.driver.gpu_s
        self.fire_due()            # those that fired within the last step
        if self.st.fb_groups:
            self.feed_back()       # the last steps' finished rows (fewer than a feedback batch)
        while self.pending:        # SimPy runs the rest after the last step (the worker's queue included)
            at, _, _, what = heapq.heappop(self.pending)
            self._fire(at, what, before_landing=False)
        self._next_event()
