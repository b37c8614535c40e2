"""The prediction driver: when a predictor's estimates exist, what they cost, and how it learns.

The engine's step loop asks the driver at fixed points of a step; the driver applies the
predictor's declared timing (``stage``, ``refresh_every``, ``after_prefill``, ``feedback``) and
costs, and writes estimates into the request table. :class:`NoPrediction` is the null object for
runs without a predictor (FCFS), so the loop has no "is there a predictor" branches.
"""

from __future__ import annotations

import numpy as np
import simpy

from predictors.base import Known, PendingUpdate, Predictor, PredictorCost
from simulator.requests import RequestTable


def refresh_due(table: RequestTable, chosen: np.ndarray, every: int) -> np.ndarray:
    """The rows of ``chosen`` just decoded to a multiple of ``every`` tokens and not finished: the
    ones a refreshing predictor re-estimates after this step."""
    generated = table.generated
    return chosen[(generated[chosen] % every == 0) & (generated[chosen] < table.length[chosen])]


class NoPrediction:
    """No predictor: nothing is estimated, charged or learnt."""

    output_kind = "length"
    scores_at_arrival = False   # may the policy order admission (scores exist before prefill)?
    gpu_s = 0.0
    cpu_s = 0.0
    updates = 0
    @property
    def mae_in_use(self) -> float | None:
        return None

    def start(self, env: simpy.Environment) -> None:
        """Start background processes (the CPU worker of online updates)."""

    def score_arrivals(self, arrived: int, now: float) -> None:
        """Score rows that arrived since the last step (arrival-stage predictors)."""

    def note_decodes(self, chosen: np.ndarray) -> None:
        """The estimates the step's decodes are scheduled on (for the in-use error)."""

    def step_charge(self, admitted: int, prefill_tokens: int) -> float:
        """GPU seconds the predictor adds to this step."""
        return 0.0

    def after_step(self, first: np.ndarray, chosen: np.ndarray, start: float, duration: float) -> None:
        """Estimates for prompts completed this step, and decode-time refreshes."""

    def feedback(self, done: np.ndarray) -> None:
        """True lengths of finished requests, for online learning."""


class PredictionDriver(NoPrediction):
    """Drives one bound predictor over one run's request table."""

    def __init__(self, predictor: Predictor, cost: PredictorCost, table: RequestTable, *, charge_cost: bool,
                 publish_at_once: bool = False):
        self.predictor, self.cost, self.table, self.charge_cost = predictor, cost, table, charge_cost
        # the step clock: an online update is published at the end of the step whose finishes complete
        # its batch, before the next step schedules (docs/semantics.md "Step clock"), not by the CPU worker
        self.publish_at_once = publish_at_once
        self.output_kind = predictor.output
        self.scores_at_arrival = predictor.stage == "arrival"
        self.at_prefill = predictor.stage == "prefill"
        self.refresh_every = predictor.refresh_every
        self.track_error = predictor.output == "length"
        self.scored = 0           # rows [0, scored) have arrival-stage scores
        self.gpu_s = 0.0          # GPU seconds charged to steps
        self.gpu_debt = 0.0       # charged to the next step
        self.cpu_s = 0.0
        self.updates = 0
        self.in_use_abs_error, self.in_use_decodes = 0.0, 0
        table.predicted[:] = predictor.prior_length

    def start(self, env: simpy.Environment) -> None:
        self.env = env
        self.updates_store = simpy.Store(env)
        env.process(self._cpu_worker())

    @property
    def mae_in_use(self) -> float | None:
        return self.in_use_abs_error / self.in_use_decodes if self.in_use_decodes else None

    def _predict(self, rows: np.ndarray) -> np.ndarray:
        t = self.table
        return self.predictor.predict(rows, Known(arrived=t.arrived_by(self.env.now), finished=t.finished))

    def score_arrivals(self, arrived: int, now: float) -> None:
        """Arrival-stage predictors score new arrivals before the step; the GPU pays next step."""
        if not self.scores_at_arrival or self.scored >= arrived:
            return
        rows = np.arange(self.scored, arrived)
        self.scored = arrived
        self.table.set_predictions(rows, self._predict(rows), now)
        if self.charge_cost:
            self.gpu_debt += self.cost.gpu_s(len(rows), int(self.table.prompt[rows].sum()))

    def note_decodes(self, chosen: np.ndarray) -> None:
        if self.track_error and len(chosen):   # error of the estimate each decoded request is scheduled on
            t = self.table
            self.in_use_abs_error += float(np.abs(t.predicted[chosen] - t.length[chosen]).sum())
            self.in_use_decodes += len(chosen)

    def step_charge(self, admitted: int, prefill_tokens: int) -> float:
        charge = self.gpu_debt
        self.gpu_debt = 0.0
        if self.at_prefill and self.charge_cost and admitted:
            charge += self.cost.gpu_s(admitted, prefill_tokens)
        self.gpu_s += charge
        return charge

    def after_step(self, first: np.ndarray, chosen: np.ndarray, start: float, duration: float) -> None:
        t, end = self.table, self.env.now
        if len(first):
            if self.at_prefill:
                self._predict_after_prefill(first, start, duration)
            else:
                observed = self.predictor.after_prefill(first)
                if observed is not None:
                    t.set_predictions(first, observed, end)
                    if self.charge_cost:
                        self.gpu_debt += self.cost.gpu_s_per_refresh * len(first)
        if self.refresh_every:
            due = refresh_due(t, chosen, self.refresh_every)
            if len(due):
                t.set_predictions(due, self.predictor.refresh(due, t.generated[due]), end)
                if self.charge_cost:
                    self.gpu_debt += self.cost.gpu_s_per_refresh * len(due)

    def _predict_after_prefill(self, rows: np.ndarray, start: float, duration: float) -> None:
        """Hidden-state predictors: the feature exists once prefill reaches the tapped layer."""
        cpu = (self.cost.cpu_s_per_prediction if self.charge_cost else 0.0) * len(rows)  # one core, in turn
        self.cpu_s += cpu
        ready = start + self.cost.tap_fraction * duration + cpu
        end = start + duration
        if ready <= end:
            self.table.set_predictions(rows, self._predict(rows), end)
            return
        def ready_now(_event, rows: np.ndarray = rows) -> None:
            self.table.set_predictions(rows, self._predict(rows), self.env.now)

        self.env.timeout(ready - end).callbacks.append(ready_now)

    def feedback(self, done: np.ndarray) -> None:
        self.learn(done, self.table.length[done])

    def learn(self, rows: np.ndarray, lengths: np.ndarray) -> None:
        """The true lengths of finished ``rows`` go to the predictor; its update is published at once
        (step clock) or queued for the CPU worker."""
        if len(rows):
            update = self.predictor.feedback(rows, lengths)
            if update is not None and self.publish_at_once:
                self._publish(update)
            elif update is not None:
                self.updates_store.put(update)

    def _cpu_worker(self):
        """Runs online-learning updates one after another; publishes each when it completes."""
        while True:
            update: PendingUpdate = yield self.updates_store.get()
            cpu = update.cpu_s if self.charge_cost else 0.0
            self.cpu_s += cpu
            if cpu > 0:
                yield self.env.timeout(cpu)
            self._publish(update)

    def _publish(self, update: PendingUpdate) -> None:
        """The update's weights go live; every resident request with an estimate is re-scored."""
        update.publish()
        self.updates += 1
        t = self.table
        rescored = t.resident[~np.isnan(t.ready_s[t.resident])]
        if len(rescored):
            t.set_predictions(rescored, self._predict(rescored), self.env.now)
