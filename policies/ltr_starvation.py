"""LTR's starvation prevention on top of the common ranking (``vllm-ltr``'s ``starv200-period10``).

LTR keeps, for every request, ``idle`` = consecutive scheduler steps in which it was not run. When
idle >= 200 the request is promoted to the top class (pri = -1, idle reset) for 10 runs: each step
in which it runs decrements the count, and at 0 it returns to pri = 0. Sort key: (pri, score).

Here the score is the common countdown key (LTR's static rank score, or predicted remaining for a
length predictor), and promoted requests are sorted before all others (keys shifted by -1e12, which
keeps their relative order). Idle steps come from the engine's view: a resident request's idle
count is ``view.step - view.last_served - 1``; a waiting request (never run) counts from the first
step the policy saw it waiting (admission is asked every step with room to admit). Runs are counted
from ``last_served`` changes between the policy's calls: a promoted request is assumed to have run
in every step since it was last seen running (it is at the top, so it does unless more than
``decode_slots`` requests are promoted; steps without contention are not shown to the policy).
Admission (prefill) counts as a run.

Note: the engine's own wait cap (default 128 steps) forces any resident request idle for more than
128 steps into the next step, so under the default engine settings LTR's 200-step promotion fires
only for waiting requests; run with ``--wait-cap 0`` for LTR's rule alone.
"""

from __future__ import annotations

import numpy as np

from policies import countdown
from policies.base import CompiledForm, Policy, SchedulerView
from policies.countdown import remaining

IDLE_STEPS = 200
RUNS = 10
PROMOTED_OFFSET = 1e12
UNSEEN = -1


class LTRStarvation(Policy):
    name = "ltr-starvation"

    def __init__(self, idle_steps: int = IDLE_STEPS, runs: int = RUNS):
        self.idle_steps, self.runs = int(idle_steps), int(runs)
        self.reset(0)

    def reset(self, n: int) -> None:
        self.runs_left = np.zeros(n, dtype=np.int64)
        self.served_seen = np.full(n, UNSEEN, dtype=np.int64)
        self.first_waiting = np.full(n, UNSEEN, dtype=np.int64)

    def _promote(self, rows: np.ndarray, served_seen: np.ndarray) -> None:
        self.runs_left[rows] = self.runs
        self.served_seen[rows] = served_seen

    def decode_keys(self, view: SchedulerView, rows):
        base = remaining(view, rows)
        if view.last_served is None or not len(rows):
            return base
        last = view.last_served[rows]
        # count the runs of promoted requests since the policy last looked
        prom = self.runs_left[rows] > 0
        if prom.any():
            r = rows[prom]
            seen = self.served_seen[r]
            ran = np.where(seen == UNSEEN, 1, np.maximum(last[prom] - seen, 0))
            self.runs_left[r] = np.maximum(self.runs_left[r] - ran, 0)
            self.served_seen[r] = last[prom]
        idle = view.step - last - 1
        new = (self.runs_left[rows] == 0) & (idle >= self.idle_steps)
        if new.any():
            self._promote(rows[new], np.full(int(new.sum()), view.step - 1))
        promoted = self.runs_left[rows] > 0
        return np.where(promoted, base - PROMOTED_OFFSET, base)

    def admission_keys(self, view: SchedulerView, rows):
        base = view.predicted[rows]
        if not len(rows):
            return base
        first = self.first_waiting[rows]
        self.first_waiting[rows] = np.where(first == UNSEEN, view.step, first)
        idle = view.step - self.first_waiting[rows]
        new = (self.runs_left[rows] == 0) & (idle >= self.idle_steps) & (self.served_seen[rows] == UNSEEN)
        if new.any():
            self._promote(rows[new], np.full(int(new.sum()), UNSEEN))
        promoted = self.runs_left[rows] > 0
        return np.where(promoted, base - PROMOTED_OFFSET, base)

    def compiled_form(self) -> CompiledForm:
        # the kernel runs these updates on this policy's own state arrays (simulator/kernel_policies.py)
        return CompiledForm(keys="rule", rule=countdown.__name__, promote_after_idle=self.idle_steps, promoted_runs=self.runs)

    def describe(self) -> dict:
        return {"name": self.name, "idle_steps": self.idle_steps, "runs": self.runs}
