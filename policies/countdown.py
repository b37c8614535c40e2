"""Countdown: shortest predicted remaining first (LEAP's rule).

Remaining = predicted length - tokens generated so far, floored at a small positive value so an
under-predicted request keeps a finite, highest priority instead of going negative. A rank-only
predictor has no length to count down from, so its static score is the key.
"""

from __future__ import annotations

import numpy as np

from policies.base import CompiledForm, Policy, SchedulerView

REMAINING_FLOOR = 0.5


def remaining(view: SchedulerView, rows: np.ndarray) -> np.ndarray:
    if view.output_kind == "rank":
        return view.predicted[rows]
    return np.maximum(view.predicted[rows] - view.generated[rows], REMAINING_FLOOR)


class Countdown(Policy):
    name = "countdown"
    compiled = live = True

    def decode_keys(self, view: SchedulerView, rows):
        return remaining(view, rows)

    def compiled_form(self) -> CompiledForm:
        return CompiledForm(keys="remaining")

    def admission_keys(self, view: SchedulerView, rows):
        return view.predicted[rows]
