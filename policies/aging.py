"""TIE's exponential aging on top of the predictor's score.

key = score * gamma ** (wait / tau), gamma = 0.9, tau = 30 s; lower keys are served first, so a
request's priority rises exponentially the longer it has waited. "Wait" counts from the request's
arrival (TIE's t_w = now - arrival). Keys are recomputed every 5 s: all requests are aged to the
same instant (the last multiple of 5 s), so with a constant score the order is exactly arrival
order, i.e. FCFS. The score is the countdown key (predicted remaining, or a rank predictor's
score, which rank predictors keep positive), so aging composes with any predictor.
"""

from __future__ import annotations

import math

import numpy as np

from policies.base import Policy, SchedulerView
from policies.countdown import remaining

GAMMA = 0.9
TAU_S = 30.0
RECOMPUTE_S = 5.0
KEY_DECIMALS = 9   # log-key resolution: far below any real difference, far above float noise


class Aging(Policy):
    name = "aging"
    live = True

    def __init__(self, gamma: float = GAMMA, tau_s: float = TAU_S, recompute_s: float = RECOMPUTE_S):
        if not 0 < gamma < 1:
            raise ValueError(f"aging gamma must be in (0, 1), got {gamma}")
        if tau_s <= 0 or recompute_s <= 0:
            raise ValueError("aging tau and recompute interval must be > 0")
        self.gamma, self.tau_s, self.recompute_s = gamma, tau_s, recompute_s
        self._log_gamma_per_s = math.log(gamma) / tau_s

    def aged(self, view: SchedulerView, rows: np.ndarray, score: np.ndarray) -> np.ndarray:
        """log(score) + wait * log(gamma) / tau: the same order as score * gamma**(wait/tau), rounded
        so that mathematically equal keys tie exactly and fall back to row order."""
        aging_clock = math.floor(view.now / self.recompute_s) * self.recompute_s
        wait = np.maximum(aging_clock - view.arrival_s[rows], 0.0)
        log_key = np.log(np.maximum(score, 1e-300)) + self._log_gamma_per_s * wait
        return np.round(log_key, KEY_DECIMALS)

    def decode_keys(self, view: SchedulerView, rows):
        return self.aged(view, rows, remaining(view, rows))

    def admission_keys(self, view: SchedulerView, rows):
        return self.aged(view, rows, view.predicted[rows])

    def describe(self) -> dict:
        return {"name": self.name, "gamma": self.gamma, "tau_s": self.tau_s, "recompute_s": self.recompute_s}
