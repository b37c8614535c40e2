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
from policies.rule import compile_rules

IDLE_STEPS = 200
RUNS = 10
PROMOTED_OFFSET = 1e12
UNSEEN = -1


def decode_row(r, step, last_served, runs_left, served_seen, idle_steps, runs):
    """Row ``r``'s state at a decode call (the compiled kernel's too): a promoted row counts the runs
    since the policy last looked (a row promoted while waiting: one), and a row idle for
    ``idle_steps`` steps is promoted for ``runs`` runs. True when its promotion began or ended."""
    last = last_served[r]
    changed = False
    if runs_left[r] > 0:
        seen = served_seen[r]
        ran = 1 if seen == UNSEEN else max(last - seen, 0)
        runs_left[r] = max(runs_left[r] - ran, 0)
        served_seen[r] = last
        changed = runs_left[r] == 0
    if runs_left[r] == 0 and step - last - 1 >= idle_steps:
        runs_left[r] = runs
        served_seen[r] = step - 1
        changed = True
    return changed


def promote_waiting(r, step, first_waiting, runs_left, served_seen, idle_steps, runs):
    """Waiting row ``r``, seen waiting since ``first_waiting[r]``, is promoted once it has waited
    ``idle_steps`` steps, never run and not promoted (the compiled kernel's test too): True then."""
    if step - first_waiting[r] >= idle_steps and runs_left[r] == 0 and served_seen[r] == UNSEEN:
        runs_left[r] = runs
        return True
    return False


def decode_rows(rows, step, last_served, runs_left, served_seen, idle_steps, runs):
    for j in range(rows.shape[0]):
        decode_row(rows[j], step, last_served, runs_left, served_seen, idle_steps, runs)


def waiting_rows(rows, step, first_waiting, runs_left, served_seen, idle_steps, runs):
    """Each waiting row's first call is noted, then :func:`promote_waiting`."""
    for j in range(rows.shape[0]):
        if first_waiting[rows[j]] == UNSEEN:
            first_waiting[rows[j]] = step
        promote_waiting(rows[j], step, first_waiting, runs_left, served_seen, idle_steps, runs)


RULES = ("decode_row", "promote_waiting", "decode_rows", "waiting_rows")


class LTRStarvation(Policy):
    name = "ltr-starvation"
    compiled, live = True, False
    why_not = {"live": "it counts a waiting request's idle steps from admission calls made every step, and the live "
                       "scheduler asks admission keys only of fresh requests under an arrival-stage predictor"}

    def __init__(self, idle_steps: int = IDLE_STEPS, runs: int = RUNS):
        self.idle_steps, self.runs = int(idle_steps), int(runs)
        self.reset(0)

    def reset(self, n: int) -> None:
        self.runs_left = np.zeros(n, dtype=np.int64)
        self.served_seen = np.full(n, UNSEEN, dtype=np.int64)
        self.first_waiting = np.full(n, UNSEEN, dtype=np.int64)

    def decode_keys(self, view: SchedulerView, rows):
        base = remaining(view, rows)
        if view.last_served is None or not len(rows):
            return base
        compile_rules(__name__)
        decode_rows(np.asarray(rows, dtype=np.int64), view.step, view.last_served, self.runs_left, self.served_seen,
                    self.idle_steps, self.runs)
        promoted = self.runs_left[rows] > 0
        return np.where(promoted, base - PROMOTED_OFFSET, base)

    def admission_keys(self, view: SchedulerView, rows):
        base = view.predicted[rows]
        if not len(rows):
            return base
        compile_rules(__name__)
        waiting_rows(np.asarray(rows, dtype=np.int64), view.step, self.first_waiting, self.runs_left,
                     self.served_seen, self.idle_steps, self.runs)
        promoted = self.runs_left[rows] > 0
        return np.where(promoted, base - PROMOTED_OFFSET, base)

    def compiled_form(self) -> CompiledForm:
        # the kernel runs these updates on this policy's own state arrays (simulator/kernel_policies.py)
        return CompiledForm(keys="rule", rule=countdown.__name__, promote_after_idle=self.idle_steps, promoted_runs=self.runs)

    def describe(self) -> dict:
        return {"name": self.name, "idle_steps": self.idle_steps, "runs": self.runs}
