"""Slack-guarded MLFQ on LEAP: FastServe's queues, LEAP's remaining estimate within a queue, and a
deadline guard for the tail.

Measured on the bundled sharegpt trace at 1.5x (docs/results.md "Keeping the tail"): countdown on
LEAP+RLS pays for its mean gain in the tail (p99 e2e about twice FCFS's), the prediction-free
``mlfq`` has a better mean than countdown there, and ``slack-countdown``'s deadline guard keeps the
tail near FCFS's. This policy combines the three:

- while a request has slack (``policies.slack_countdown``: arrival + ``horizon_s`` - now -
  ``token_s`` x its predicted remaining tokens > 0), its key is its MLFQ queue
  (``policies.mlfq``, the default quanta) x 1e6 + its predicted remaining tokens (countdown's key):
  least attained service first, and within a queue the shortest predicted remaining first;
- once its slack is spent it is urgent: before every other request, earliest deadline first.

Settings (``--setting slack-mlfq.KEY=VALUE``, > 0): ``horizon_s`` (55 s, the value that kept p99
e2e within 0.5% of FCFS's there) and ``token_s`` (0.025 s). Not compiled (as slack-countdown: a
request turns urgent as the clock passes); live (the view has the clock, arrivals, prompts,
tokens and estimates).
"""

from __future__ import annotations

from policies import mlfq, rule
from policies.base import SchedulerView
from policies.countdown import remaining
from policies.slack_countdown import TOKEN_S, SlackCountdown

HORIZON_S = 55.0
QUEUE_WIDTH = 1e6   # above any remaining estimate (max_tokens is far below it), so the queue decides first


class SlackMLFQ(SlackCountdown):
    name = "slack-mlfq"
    settings_defaults = {"horizon_s": HORIZON_S, "token_s": TOKEN_S}

    def __init__(self, horizon_s: float = HORIZON_S, token_s: float = TOKEN_S):
        super().__init__(horizon_s=horizon_s, token_s=token_s)
        self.queues = mlfq.MLFQ()

    def decode_keys(self, view: SchedulerView, rows):
        left = remaining(view, rows)
        level = rule.keys(mlfq.__name__, "decode_key", view, rows, self.queues.params())
        return self.slack_keys(view, rows, left, level * QUEUE_WIDTH + left)
