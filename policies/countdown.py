"""Countdown: shortest predicted remaining first (LEAP's rule).

Remaining = predicted length - tokens generated so far, floored at a small positive value so an
under-predicted request keeps a finite, highest priority instead of going negative (an estimate
not yet made, nan, takes the floor). A rank-only predictor has no length to count down from, so
its static score is the key. Written once as a rule (``policies/rule.py``): the compiled kernel
compiles these functions, and aging, SSJF's and TRAIL's policies start from the same keys.

Admission (asked only when an arrival-stage predictor scores requests before prefill) is shortest
predicted first; with ``--setting countdown.prefill_weight=W`` (> 0) a waiting request's prefill
counts too, W output tokens' worth per uncached prompt token: key = estimate + W x (prompt -
cached), ``cached`` the tokens its prompt finds in the prefix cache (``SchedulerView.cached``: 0
without one), so a request whose history is cached costs only its new tokens. The default, 0, is
LEAP's rule as published (no prefill term). A rank predictor's scores take no prefill term.
"""

from __future__ import annotations

import numpy as np

from policies import rule
from policies.base import SchedulerView

REMAINING_FLOOR = 0.5


def decode_key(r, t, rank):
    """Row ``r``'s predicted remaining length (a rank predictor's score as it is)."""
    if rank:
        return t.predicted[r]
    key = t.predicted[r] - t.generated[r]
    return key if key > REMAINING_FLOOR else REMAINING_FLOOR


def admission_key(r, t, rank):
    """Row ``r``'s estimate, plus ``prefill_weight`` (``t.params[0]``) x its uncached prompt tokens."""
    key = t.predicted[r]
    weight = t.params[0]
    if weight > 0.0 and not rank:
        key = key + weight * (t.prompt[r] - t.cached[r])
    return key


RULES = ("decode_key", "admission_key")


def remaining(view: SchedulerView, rows: np.ndarray) -> np.ndarray:
    """The decode keys of ``rows``: :func:`decode_key` of each."""
    return rule.keys(__name__, "decode_key", view, rows)


class Countdown(rule.RulePolicy):
    name = "countdown"
    compiled = live = True
    rule = __name__
    settings_defaults = {"prefill_weight": 0.0}

    def __init__(self, prefill_weight: float = 0.0):
        if not prefill_weight >= 0:
            raise ValueError(f"countdown: prefill_weight must be >= 0, got {prefill_weight}")
        self.prefill_weight = prefill_weight
        self.reads_cached = prefill_weight > 0

    def params(self) -> tuple[float, ...]:
        return (float(self.prefill_weight),)
