"""One engine step's two halves, shared by the single engine's loop and every replica of a fleet.

A step is composed at its start (:meth:`EngineParts.begin`: arrival scores, the scheduler's batch,
its duration) and lands at its end (:meth:`EngineParts.end`: tokens, estimates, completions,
feedback). The SimPy process in between only waits; keeping the halves here means the single
engine (``simulator/engine.py``) and a fleet's replicas (``simulator/fleet.py``) run the same step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from policies.base import Policy, SchedulerView
from predictors.base import PredictorCost
from simulator.config import EngineConfig
from simulator.prediction import NoPrediction, PredictionDriver
from simulator.profiles.base import EngineProfile
from simulator.requests import RequestTable, clock_step
from simulator.scheduler import Batch, Scheduler


@dataclass
class EngineParts:
    """The parts of one engine over one request table (the step loop only orchestrates them)."""

    table: RequestTable
    scheduler: Scheduler
    driver: NoPrediction
    profile: EngineProfile
    config: EngineConfig
    step_clock: bool
    log: object | None = None   # a simulator.engine.StepLog when steps are recorded

    def begin(self, now: float, arrived: int, step: int) -> tuple[Batch, float]:
        """Compose the step starting at ``now`` with rows [0, arrived) arrived; returns it and its duration."""
        driver = self.driver
        driver.score_arrivals(arrived, now)
        batch = self.scheduler.compose(arrived, step, now)
        driver.note_decodes(batch.chosen)
        duration = self.profile.step_time(batch.prefill_tokens, batch.prefill_sq, len(batch.chosen), batch.context)
        duration += driver.step_charge(len(batch.admit), batch.prefill_tokens)
        if self.log is not None:
            self.log.record(now, duration, batch, arrived, self.config.max_resident)  # type: ignore[attr-defined]
        return batch, duration

    def end(self, batch: Batch, step: int, start: float, duration: float, end: float) -> None:
        """Land the step that ran from ``start`` (for ``duration``) to ``end``: tokens, estimates, completions, feedback."""
        table, driver = self.table, self.driver
        done = table.land(step, clock_step(step, start, self.step_clock), start, end, batch.chosen,
                          batch.n_forced, batch.admit, batch.first, batch.prefill_tokens, batch.resumed)
        driver.after_step(batch.first, batch.chosen, start, duration)
        joined, row_order = batch.first, self.scheduler.ordered_admission
        if self.scheduler.kv is not None:   # re-prefills rejoin the residents (in row order), finished rows free their blocks
            self.scheduler.kv.release(done)
            joined, row_order = np.concatenate([batch.resumed, batch.first]), True
        table.retire(done, joined, end, row_order)
        if self.log is not None:
            self.log.finished.append(table.finished)  # type: ignore[attr-defined]
        driver.feedback(done)


def build_parts(table: RequestTable, policy: Policy, predictor, cost: PredictorCost | None, profile: EngineProfile,
                config: EngineConfig, env: simpy.Environment, *, charge_cost: bool, step_clock: bool,
                log: object | None = None, driver_cls: type[PredictionDriver] = PredictionDriver,
                driver: NoPrediction | None = None, scheduler_cls: type[Scheduler] = Scheduler) -> EngineParts:
    """One engine's parts over its own request table: the single engine's, every fleet replica's and
    every prefill/decode instance's (``predictor``: a bound predictor, or a replica's view of one;
    None: no predictor; ``driver``: one made by the caller instead, e.g. a decode instance's carried
    estimates). The policy sees the table's rows and their request attributes."""
    if driver is None and predictor is None:
        driver = NoPrediction()
    elif driver is None:
        assert cost is not None   # a predictor always has a cost (FREE at least)
        driver = driver_cls(predictor, cost, table, charge_cost=charge_cost, publish_at_once=step_clock)
    view = SchedulerView(now=0.0, arrival_s=table.arrival, predicted=table.predicted, generated=table.generated,
                         output_kind=driver.output_kind, step=0, last_served=table.last_served,
                         first_predicted=table.first_predicted, attributes=table.attributes, prompt=table.prompt)
    policy.reset(table.n)
    scheduler = scheduler_cls(policy, config, table, view, driver.scores_at_arrival and policy.uses_predictions)
    driver.start(env)
    return EngineParts(table, scheduler, driver, profile, config, step_clock, log)
