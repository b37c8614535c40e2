"""Earliest deadline first, the deadlines from the run's SLOs (``--slo ttft:MS tpot:MS e2el:MS``).

A request's next token is due at arrival + TTFT + g x TPOT, g its output tokens so far (its
first token is due at arrival + TTFT; the (g+1)-th, g TPOTs later), and its last at arrival +
E2EL. The key is the earliest deadline the request faces now: the next token's (when the run has
a TTFT or TPOT objective; a missing one counts 0) and the end-to-end one (when it has E2EL), ties
by row (arrival). A request past its deadline keeps its (earliest) key: late ones go first, as
EDF does. It reads no prediction and needs SLOs: ``simulate --policy edf`` without ``--slo`` is
refused. A decode raises the row's next deadline (``keys_rise``). Written once as a rule
(``policies/rule.py``, the SLOs in ``t.params``): compiled. Not live: ``leap-serve`` takes no SLOs.
"""

from __future__ import annotations

from policies import rule


def decode_key(r, t, rank):
    """Row ``r``'s earliest deadline in seconds (lower first)."""
    due = t.arrival[r] + t.params[3]
    if t.params[0] > 0.0:
        token = t.arrival[r] + t.params[1] + t.generated[r] * t.params[2]
        if token < due:
            due = token
    return due


def admission_key(r, t, rank):
    """Row ``r``'s first deadline."""
    return decode_key(r, t, rank)


RULES = ("decode_key", "admission_key")


class EDF(rule.RulePolicy):
    name = "edf"
    uses_predictions = False
    compiled = True
    live = False
    why_not = {"live": "leap-serve takes no SLOs (--slo is a simulate flag), so it has no deadlines to order by"}
    keys_rise = True
    needs_slo = True
    rule = __name__

    def __init__(self, slos: dict[str, float] | None = None):
        slos = dict(slos or {})
        if not slos:
            raise ValueError("policy 'edf' orders by SLO deadlines: give them with --slo (e.g. --slo ttft:2000 tpot:100)")
        self.slos = slos

    def params(self) -> tuple[float, ...]:
        token = "ttft" in self.slos or "tpot" in self.slos
        return (1.0 if token else 0.0, self.slos.get("ttft", 0.0) / 1000.0, self.slos.get("tpot", 0.0) / 1000.0,
                self.slos["e2el"] / 1000.0 if "e2el" in self.slos else float("inf"))

    def describe(self) -> dict:
        return {"name": self.name, "slos_ms": dict(self.slos)}
