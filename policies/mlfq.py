"""FastServe's skip-join multi-level feedback queue (least attained service, no prediction).

FastServe (Wu et al., "Fast Distributed Inference Serving for Large Language Models", 2023,
arXiv:2305.05920, section 4.1) keeps K queues Q_0 (highest) .. Q_{K-1}; the quantum of each queue
is twice the one above it (quantum_i = quantum x 2**i); a job is demoted to the next queue when it
has used its queue's quantum, and jobs in one queue are served first come, first served.
*Skip-join*: a new job does not always start in Q_0; it joins the highest queue whose quantum
covers its first iteration (the prefill, whose time grows with the prompt), so long prompts skip
the queues they would only block.

Here, in tokens (one decode step = one token of attained service):
- entry queue e = the first i with ``entry_tokens`` x 2**i >= prompt tokens (capped at K - 1);
- attained service g = output tokens emitted so far (the prefill's first one included);
- the row is in queue L: starting from e, it moves down one queue each time it has used that
  queue's quantum (quantum_e, then quantum_{e+1}, ...), never below K - 1;
- the key is L, ties by row (arrival): FCFS within a queue.
Settings (``--setting mlfq.KEY=VALUE``, each > 0): ``quantum`` (Q_0's quantum in tokens, 16),
``levels`` (K, 6), ``entry_tokens`` (the prompt a Q_0 quantum covers, 256). The paper sets the
ratio 2 between queues; the token values are this project's (the paper states its quanta in
time). FastServe's starvation promotion is not modelled: the engine's wait cap (128 steps) bounds
how long a resident goes undecoded. A decode can move a row down a queue, so its key rises
(``keys_rise``). Written once as a rule (``policies/rule.py``): compiled, and live.
"""

from __future__ import annotations

from policies import rule

QUANTUM = 16
LEVELS = 6
ENTRY_TOKENS = 256


def entry_level(r, t):
    """Row ``r``'s skip-join queue: the first i with entry_tokens x 2**i >= its prompt (< levels)."""
    levels = int(t.params[1])
    covered = t.params[2]
    level = 0
    while level < levels - 1 and covered < t.prompt[r]:
        covered *= 2.0
        level += 1
    return level


def decode_key(r, t, rank):
    """Row ``r``'s queue after the tokens it has emitted (lower first; ties by arrival)."""
    levels = int(t.params[1])
    level = entry_level(r, t)
    left = float(t.generated[r])
    quantum = t.params[0] * 2.0 ** level
    while level < levels - 1 and left >= quantum:
        left -= quantum
        level += 1
        quantum *= 2.0
    return float(level)


def admission_key(r, t, rank):
    """Row ``r``'s entry queue."""
    return float(entry_level(r, t))


RULES = ("entry_level", "decode_key", "admission_key")


class MLFQ(rule.RulePolicy):
    name = "mlfq"
    uses_predictions = False
    compiled = live = True
    keys_rise = True
    rule = __name__
    settings_defaults = {"quantum": QUANTUM, "levels": LEVELS, "entry_tokens": ENTRY_TOKENS}

    def __init__(self, quantum: int = QUANTUM, levels: int = LEVELS, entry_tokens: int = ENTRY_TOKENS):
        if quantum <= 0 or levels <= 0 or entry_tokens <= 0:
            raise ValueError(f"mlfq: quantum, levels and entry_tokens must be > 0, got {quantum}, {levels}, "
                             f"{entry_tokens}")
        self.quantum, self.levels, self.entry_tokens = quantum, levels, entry_tokens

    def params(self) -> tuple[float, ...]:
        return (float(self.quantum), float(self.levels), float(self.entry_tokens))
