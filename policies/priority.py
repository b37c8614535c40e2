"""vLLM V1's priority scheduling: the request attribute ``priority`` (lower first), then arrival.

vLLM (``--scheduling-policy priority``) keeps its queues ordered by ``(request.priority,
request.arrival_time)``; here the key is the row's ``priority`` (:mod:`core.attributes`, the
trace column ``priority``, 0 when the trace has none) and the engine breaks ties by row, i.e. by
arrival, so the order is vLLM's. Without a ``priority`` column every key is 0 and the policy is
FCFS. It reads no prediction (admission stays in arrival order: the engine orders admission only
by an arrival-stage predictor's scores, docs/semantics.md "A step"). Written once as a rule
(``policies/rule.py``): compiled, and live (vLLM's ``Request.priority``).
"""

from __future__ import annotations

from policies import rule


def decode_key(r, t, rank):
    """Row ``r``'s priority class (lower first; ties by arrival)."""
    return float(t.attributes.priority[r])


def admission_key(r, t, rank):
    """The same class for admission."""
    return float(t.attributes.priority[r])


RULES = ("decode_key", "admission_key")


class Priority(rule.RulePolicy):
    name = "priority"
    uses_predictions = False
    compiled = live = True
    rule = __name__
