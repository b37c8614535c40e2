"""TIE's exponential aging on top of the predictor's score.

key = score * gamma ** (wait / tau), gamma = 0.9, tau = 30 s; lower keys are served first, so a
request's priority rises exponentially the longer it has waited. "Wait" counts from the request's
arrival (TIE's t_w = now - arrival). Keys are recomputed every 5 s: all requests are aged to the
same instant (the last multiple of 5 s), so with a constant score the order is exactly arrival
order, i.e. FCFS. The score is the countdown key (predicted remaining, or a rank predictor's
score, which rank predictors keep positive), so aging composes with any predictor.

The log is libm's (``math.log``), not numpy's: numpy's SIMD log (AVX-512) differs from libm in the
last bit on some inputs. One row's key is written once (:func:`aged_key`): the reference calls it
row by row (compiled in place with numba) and the compiled kernel compiles it in
(``simulator/kernel_policies.py``), so both kernels compute the same keys bit for bit. The rounding
is numpy's own ``np.round`` (multiply, round half to even, divide) written out.
"""

from __future__ import annotations

import math

import numpy as np

from policies import countdown
from policies.base import CompiledForm, Policy, SchedulerView
from policies.countdown import remaining
from policies.rule import compile_rules

GAMMA = 0.9
TAU_S = 30.0
RECOMPUTE_S = 5.0
KEY_DECIMALS = 9   # log-key resolution: far below any real difference, far above float noise
KEY_SCALE = 10.0 ** KEY_DECIMALS   # np.round(x, KEY_DECIMALS) is np.rint(x * KEY_SCALE) / KEY_SCALE
SCORE_FLOOR = 1e-300               # the log of a score <= 0 stays finite


def aged_key(score, arrival, clock, log_rate):
    """One row's key (the compiled kernel's too): round(log(max(score, 1e-300)) + log_rate x
    max(clock - arrival, 0), 9 decimals), libm's log and numpy's round written out (``np.rint``
    rounds half to even); a nan score or wait stays nan."""
    wait = clock - arrival
    if wait < 0.0:
        wait = 0.0
    if score < SCORE_FLOOR:
        score = SCORE_FLOOR
    return np.rint((math.log(score) + log_rate * wait) * KEY_SCALE) / KEY_SCALE


def aged_rows(scores, arrival, rows, clock, log_rate, out):
    """:func:`aged_key` of each of ``rows`` (``scores`` in the same order), into ``out``."""
    for j in range(rows.shape[0]):
        out[j] = aged_key(scores[j], arrival[rows[j]], clock, log_rate)


RULES = ("aged_key", "aged_rows")


class Aging(Policy):
    name = "aging"
    compiled = live = True

    def __init__(self, gamma: float = GAMMA, tau_s: float = TAU_S, recompute_s: float = RECOMPUTE_S):
        if not 0 < gamma < 1:
            raise ValueError(f"aging gamma must be in (0, 1), got {gamma}")
        if tau_s <= 0 or recompute_s <= 0:
            raise ValueError("aging tau and recompute interval must be > 0")
        self.gamma, self.tau_s, self.recompute_s = gamma, tau_s, recompute_s
        self._log_gamma_per_s = math.log(gamma) / tau_s

    def aged(self, view: SchedulerView, rows: np.ndarray, score: np.ndarray) -> np.ndarray:
        """log(score) + wait * log(gamma) / tau: the same order as score * gamma**(wait/tau), rounded
        so that mathematically equal keys tie exactly and fall back to row order (:func:`aged_key`)."""
        aging_clock = math.floor(view.now / self.recompute_s) * self.recompute_s
        out = np.empty(len(rows), dtype=np.float64)
        compile_rules(__name__)
        aged_rows(np.ascontiguousarray(score, dtype=np.float64), view.arrival_s, np.asarray(rows, dtype=np.int64),
                  aging_clock, self._log_gamma_per_s, out)
        return out

    def decode_keys(self, view: SchedulerView, rows):
        return self.aged(view, rows, remaining(view, rows))

    def admission_keys(self, view: SchedulerView, rows):
        return self.aged(view, rows, view.predicted[rows])

    def compiled_form(self) -> CompiledForm:
        return CompiledForm(keys="rule", rule=countdown.__name__, aging_log_rate=self._log_gamma_per_s, aging_every_s=self.recompute_s)

    def describe(self) -> dict:
        return {"name": self.name, "gamma": self.gamma, "tau_s": self.tau_s, "recompute_s": self.recompute_s}
