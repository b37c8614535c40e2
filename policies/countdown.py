"""Countdown: shortest predicted remaining first (LEAP's rule).

Remaining = predicted length - tokens generated so far, floored at a small positive value so an
under-predicted request keeps a finite, highest priority instead of going negative (an estimate
not yet made, nan, takes the floor). A rank-only predictor has no length to count down from, so
its static score is the key. Written once as a rule (``policies/rule.py``): the compiled kernel
compiles these functions, and aging, SSJF's and TRAIL's policies start from the same keys.
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
    """Row ``r``'s estimate: shortest predicted first."""
    return t.predicted[r]


RULES = ("decode_key", "admission_key")


def remaining(view: SchedulerView, rows: np.ndarray) -> np.ndarray:
    """The decode keys of ``rows``: :func:`decode_key` of each."""
    return rule.keys(__name__, "decode_key", view, rows)


class Countdown(rule.RulePolicy):
    name = "countdown"
    compiled = live = True
    rule = __name__
