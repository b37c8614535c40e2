"""Highest response ratio next: (wait + expected service) / expected service, highest first.

The classic HRRN ratio, as SGLang's scheduler orders its waiting requests by it with the prompt's
length as the expected service: a request's ratio grows with its wait, faster for a short one, so
short requests go first and long ones cannot starve. Here, for each decode decision (and for
admission, when an arrival-stage predictor runs):

    ratio = (wait / token_s + S) / S,   wait = now - arrival (seconds),

S the expected service in tokens: the predictor's estimate of the total length when a length
predictor runs (its current estimate), else the prompt's uncached tokens (prompt - cached, the
tokens found in the prefix cache at admission: SGLang's HRRN orders by the uncached length; the
whole prompt without a cache); floored at 1. ``token_s`` turns
the wait into tokens (``--setting hrrn.token_s=...``, > 0; 0.025 s, about one decode step of the
default profile at load). The key is -ratio (lower first), ties by row (arrival).

Not compiled: the keys depend on the clock (every row's ratio grows at its own rate, 1 / S, so
the order changes between steps without any row's state changing), and the kernel's rules
(``policies/rule.py``) re-key a row only when its state does. Runs on the reference engine (and
live: the view has the clock, arrivals, prompts and estimates).
"""

from __future__ import annotations

import numpy as np

from policies.base import Policy, SchedulerView

TOKEN_S = 0.025


class HRRN(Policy):
    name = "hrrn"
    uses_predictions = False
    compiled = False
    live = True
    why_not = {"compiled": "its keys depend on the clock (each row's ratio grows at its own rate), and the "
                           "kernel's rules re-key a row only when its own state changes"}
    settings_defaults = {"token_s": TOKEN_S}

    def __init__(self, token_s: float = TOKEN_S):
        if not token_s > 0:
            raise ValueError(f"hrrn: token_s must be > 0, got {token_s}")
        self.token_s = token_s

    def ratio_keys(self, view: SchedulerView, rows: np.ndarray) -> np.ndarray:
        """-(wait / token_s + S) / S of each of ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        predicted = view.predicted[rows]
        prompt = (view.prompt[rows] if view.prompt is not None else np.zeros(len(rows))).astype(np.float64)
        if view.cached is not None:
            prompt = prompt - view.cached[rows]
        by_estimate = (view.output_kind == "length") & (predicted > 0)
        service = np.maximum(np.where(by_estimate, predicted, prompt), 1.0)
        wait = np.maximum(view.now - view.arrival_s[rows], 0.0) / self.token_s
        return -(wait + service) / service

    def decode_keys(self, view: SchedulerView, rows):
        return self.ratio_keys(view, rows)

    def admission_keys(self, view: SchedulerView, rows):
        return self.ratio_keys(view, rows)
