"""TRAIL's SPRPT with limited preemption (c = 0.8, the paper's value).

Priority = predicted remaining (countdown). A request whose generated tokens exceed c x its
INITIAL prediction (``view.first_predicted``: TRAIL's prompt-prior estimate) becomes
non-preemptible: if it held a decode slot in the previous step (``view.last_served == step - 1``)
it keeps it -- its key is -inf, below every other key (a rank predictor's scores included, whatever
their sign). At most ``decode_slots`` requests can hold slots, so the locked ones always fit.

TRAIL also sorts such a request LAST in its waiting queue (priority +inf), which in SGLang only
matters after a KV-pressure eviction; here a locked request that lost its slot (only possible when
the engine's wait cap forces other requests in) competes again with its ordinary countdown key
instead of being sent to the back. Admission: by predicted length (TRAIL's waiting-queue order by
the prompt prior).
"""

from __future__ import annotations

import numpy as np

from policies import countdown
from policies.base import CompiledForm, Policy, SchedulerView
from policies.countdown import remaining
from policies.rule import compile_rules

PREEMPTION_LIMIT = 0.8
LOCKED_KEY = -np.inf  # below every key: countdown's (>= 0.5, the floor) and any rank score


def locked_row(r, step, c, last_served, generated, first_predicted):
    """Row ``r`` keeps its slot (the compiled kernel's test too): decoded in the previous step and
    generated past ``c`` x its first estimate (a nan first estimate: never)."""
    return last_served[r] == step - 1 and generated[r] > c * first_predicted[r]


def locked_rows(rows, step, c, last_served, generated, first_predicted, out):
    """:func:`locked_row` of each of ``rows``, into ``out``."""
    for j in range(rows.shape[0]):
        out[j] = locked_row(rows[j], step, c, last_served, generated, first_predicted)


RULES = ("locked_row", "locked_rows")


class TrailPreemption(Policy):
    name = "trail-preemption"
    compiled, live = True, False
    why_not = {"live": "its lock is held against TRAIL's first (prompt-prior) estimate, and TRAIL does not run live"}

    def __init__(self, c: float = PREEMPTION_LIMIT):
        if c < 0:
            raise ValueError(f"preemption limit c must be >= 0, got {c}")
        self.c = float(c)

    def locked(self, view: SchedulerView, rows: np.ndarray) -> np.ndarray:
        out = np.zeros(len(rows), dtype=bool)
        if view.first_predicted is None or view.last_served is None:
            return out
        compile_rules(__name__)
        locked_rows(np.asarray(rows, dtype=np.int64), view.step, self.c, view.last_served, view.generated,
                    view.first_predicted, out)
        return out

    def decode_keys(self, view: SchedulerView, rows):
        keys = remaining(view, rows)
        return np.where(self.locked(view, rows), LOCKED_KEY, keys)

    def admission_keys(self, view: SchedulerView, rows):
        return view.predicted[rows]

    def compiled_form(self) -> CompiledForm:
        return CompiledForm(keys="rule", rule=countdown.__name__, lock_after=self.c)

    def describe(self) -> dict:
        return {"name": self.name, "c": self.c}
