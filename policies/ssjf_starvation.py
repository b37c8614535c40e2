"""SSJF's scheduler: shortest predicted job first, with its starvation override.

SSJF (``model-serving/sjf_dynamic.py``): let j be the request that has waited longest. If
wait_j > 100 s or wait_j > 10 x exec_j, the queue is ordered by waiting time (oldest first) for
that decision; otherwise by predicted time. Here each scheduling decision is one engine step's
choice among a set of requests (residents competing for decode slots, or waiting requests for
admission), and the rule is applied to that set:
- wait = now - arrival (a resident request's "waiting" counts from its arrival, like SSJF's job
  wait, which ends only when the job is done in its non-preemptive setting);
- exec_j = 0.1 s + 0.02 s x predicted tokens (SSJF's simulator constants; with a length
  predictor the prediction in tokens, as in SSJF's regression mode. For the ``ssjf`` predictor this
  is its class's median training length; for a rank predictor the score is used as is);
- otherwise the keys are the common countdown keys (predicted remaining for decode slots,
  predicted length for admission), so with the override never firing this is ``countdown``.
"""

from __future__ import annotations

import numpy as np

from policies import countdown
from policies.base import CompiledForm, Policy, SchedulerView
from policies.countdown import remaining

WAIT_THRESHOLD_S = 100.0
WAIT_COEFFICIENT = 10.0
EXEC_BASE_S = 0.1
EXEC_PER_TOKEN_S = 0.02


def starving_row(wait, predicted, threshold_s, factor, base_s, per_token_s):
    """The override fires for a decision whose longest-waiting row has waited ``wait`` with estimate
    ``predicted`` (the compiled kernel's test too): wait > threshold or wait > factor x its
    predicted execution time (base + per token x max(estimate, 0); a nan estimate stays nan)."""
    if predicted < 0.0:
        predicted = 0.0
    exec_s = base_s + per_token_s * predicted
    return wait > threshold_s or wait > factor * exec_s


class SSJFStarvation(Policy):
    name = "ssjf-starvation"
    compiled, live = True, False
    why_not = {"live": "its override weighs waits against SSJF's simulated execution times (0.1 s + 0.02 s per "
                       "token), which no live run has been checked against"}

    def __init__(self, threshold_s: float = WAIT_THRESHOLD_S, coefficient: float = WAIT_COEFFICIENT):
        self.threshold_s, self.coefficient = float(threshold_s), float(coefficient)

    def starving(self, view: SchedulerView, rows: np.ndarray) -> bool:
        if not len(rows):
            return False
        arrival = view.arrival_s[rows]
        j = rows[int(np.argmin(arrival))]          # ties: the first row, i.e. the earliest id
        return starving_row(view.now - view.arrival_s[j], float(view.predicted[j]), self.threshold_s,
                            self.coefficient, EXEC_BASE_S, EXEC_PER_TOKEN_S)

    def decode_keys(self, view: SchedulerView, rows):
        if self.starving(view, rows):
            return view.arrival_s[rows]
        return remaining(view, rows)

    def admission_keys(self, view: SchedulerView, rows):
        if self.starving(view, rows):
            return view.arrival_s[rows]
        return view.predicted[rows]

    def compiled_form(self) -> CompiledForm:
        return CompiledForm(keys="rule", rule=countdown.__name__, starve_after_s=self.threshold_s, starve_factor=self.coefficient,
                            exec_base_s=EXEC_BASE_S, exec_per_token_s=EXEC_PER_TOKEN_S)

    def describe(self) -> dict:
        return {"name": self.name, "threshold_s": self.threshold_s, "coefficient": self.coefficient,
                "exec_base_s": EXEC_BASE_S, "exec_per_token_s": EXEC_PER_TOKEN_S}
