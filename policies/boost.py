"""gamma-Boost: first come, first served on arrival times boosted by a size signal (no prediction needed).

"Beyond Prediction: Tail-Aware Scheduling for LLM Inference" (Li et al., ICML 2026,
arXiv:2606.18431) replaces length prediction by soft priority boosting with one knob, gamma, that
interpolates between FCFS (gamma -> infinity) and SJF (gamma -> 0). Its equations were not in the
material this project could read (the abstract and the project page only), so this file implements,
and names as such, the boost rule that framework builds on: Yu and Scully's gamma-Boost
("Strongly Tail-Optimal Scheduling in the Light-Tailed M/G/1", SIGMETRICS 2024). Each request is
served in order of its *boosted arrival time*

    key = arrival_s - b(s),   b(s) = (1 / gamma) x ln(1 / (1 - exp(-gamma x s))),

s its size in seconds: ``token_s`` x its size in tokens. b falls from +infinity (s -> 0) to 0
(s -> infinity): small jobs are boosted most; as gamma grows every boost vanishes (FCFS); as gamma
falls the ln(s) term dominates (shortest first). The size in tokens is the predictor's remaining
estimate when a length predictor runs (countdown's key: estimate - generated, floored at 0.5),
else the prompt's tokens (the signal a request carries without prediction, as in SGLang's
prompt-length policies). The paper's cache-aware preemption is not modelled here (the engine
preempts only under ``--kv-blocks``, in the policy's order).

Settings (``--setting boost.KEY=VALUE``, each > 0): ``gamma`` in 1/s (0.05), ``token_s`` (0.025 s,
about one decode step of the default profile at load). The key moves only when the row decodes
(a smaller remaining estimate: it falls) or gets a new estimate, so it is a rule
(``policies/rule.py``): compiled, and live. libm's log and expm1 in both engines.
"""

from __future__ import annotations

import math

from policies import countdown, rule

GAMMA = 0.05
TOKEN_S = 0.025
SIZE_FLOOR = 0.5


def size_tokens(r, t, rank):
    """Row ``r``'s size signal: its predicted remaining tokens (a length predictor's estimate), else
    its prompt; floored at 0.5."""
    size = countdown.decode_key(r, t, rank) if (not rank and t.predicted[r] > 0.0) else float(t.prompt[r])
    return size if size > SIZE_FLOOR else SIZE_FLOOR


def boosted(r, t, size):
    """arrival - (1/gamma) ln(1 / (1 - exp(-gamma s))), s = token_s x size (both engines: libm)."""
    gamma = t.params[0]
    x = gamma * t.params[1] * size
    return t.arrival[r] + math.log(-math.expm1(-x)) / gamma


def decode_key(r, t, rank):
    """Row ``r``'s boosted arrival time (lower first)."""
    return boosted(r, t, size_tokens(r, t, rank))


def admission_key(r, t, rank):
    """The same for admission (an arrival-stage predictor's estimate, else the prompt)."""
    return boosted(r, t, size_tokens(r, t, rank))


RULES = ("size_tokens", "boosted", "decode_key", "admission_key")


class Boost(rule.RulePolicy):
    name = "boost"
    uses_predictions = False
    compiled = live = True
    rule = __name__
    settings_defaults = {"gamma": GAMMA, "token_s": TOKEN_S}

    def __init__(self, gamma: float = GAMMA, token_s: float = TOKEN_S):
        if not gamma > 0 or not token_s > 0:
            raise ValueError(f"boost: gamma and token_s must be > 0, got {gamma}, {token_s}")
        self.gamma, self.token_s = gamma, token_s

    def params(self) -> tuple[float, ...]:
        return (float(self.gamma), float(self.token_s))
