"""Slack-aware countdown: LEAP's shortest-predicted-remaining-first, until a request's slack runs out.

Countdown (``policies.countdown``) wins the mean by letting short requests pass long ones; its cost
is the tail: a long request can be passed for as long as short ones keep arriving (README: p95 e2e
+76% at 1.5x). Here every request gets a deadline, ``horizon_s`` after its arrival, and its slack
at decision time ``now`` is

    slack = arrival + horizon_s - now - token_s x remaining,

remaining = its predicted remaining tokens (countdown's key): the time it would have left if it
were decoded in every step from now on. A request with slack > 0 is keyed by countdown; one whose
slack is spent is *urgent*: urgent requests come before every other, earliest deadline (so
earliest arrival) first. With a good estimate a short request is almost never urgent (its
remaining work is small), while a long one becomes urgent early enough to finish near its deadline
instead of last. Settings (``--setting slack-countdown.KEY=VALUE``, > 0): ``horizon_s`` (60 s)
and ``token_s`` (0.025 s, about one decode step of the default profile at load).

Not compiled: a request turns urgent as the clock passes a time of its own, with no change to its
state, and the kernel's rules re-key a row only when its state changes. Runs on the reference
engine, and live (the view has the clock, arrivals and estimates).
"""

from __future__ import annotations

import numpy as np

from policies.base import Policy, SchedulerView
from policies.countdown import remaining

HORIZON_S = 60.0
TOKEN_S = 0.025
URGENT = -1e12   # below every countdown key (>= 0.5); deadlines (< 1e6 s) still resolve to 1e-4 s


class SlackCountdown(Policy):
    name = "slack-countdown"
    compiled = False
    live = True
    why_not = {"compiled": "a request turns urgent as the clock passes its own time, with no change to its "
                           "state, and the kernel's rules re-key a row only when its state changes"}
    settings_defaults = {"horizon_s": HORIZON_S, "token_s": TOKEN_S}

    def __init__(self, horizon_s: float = HORIZON_S, token_s: float = TOKEN_S):
        if not horizon_s > 0 or not token_s > 0:
            raise ValueError(f"slack-countdown: horizon_s and token_s must be > 0, got {horizon_s}, {token_s}")
        self.horizon_s, self.token_s = horizon_s, token_s

    def slack_keys(self, view: SchedulerView, rows: np.ndarray, left: np.ndarray,
                   base: np.ndarray | None = None) -> np.ndarray:
        """``base`` (default countdown's key ``left``) where slack remains; URGENT + deadline where it
        is spent (``left``: the predicted remaining tokens)."""
        rows = np.asarray(rows, dtype=np.int64)
        deadline = view.arrival_s[rows] + self.horizon_s
        urgent = deadline - view.now - self.token_s * left <= 0.0
        return np.where(urgent, URGENT + deadline, left if base is None else base)

    def decode_keys(self, view: SchedulerView, rows):
        return self.slack_keys(view, rows, remaining(view, rows))

    def admission_keys(self, view: SchedulerView, rows):
        return self.slack_keys(view, rows, view.predicted[np.asarray(rows, dtype=np.int64)])
