"""Which resident requests decode in a step: the wait cap first, then the policy's order.

One function serves the simulator (``simulator.engine``) and the live vLLM scheduler
(``live.scheduler``), so both apply the same rule to the same state. ``ready`` are row indices
into the view's arrays in row (arrival) order; every sort is stable, so ties keep that order.
"""

from __future__ import annotations

import numpy as np

from policies.base import Policy, SchedulerView


def rank(policy: Policy, view: SchedulerView, rows: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` of ``rows`` by the policy's decode keys (row order for FCFS)."""
    keys = policy.decode_keys(view, rows)
    if keys is None:
        return rows[:k]
    return rows[np.argsort(keys, kind="stable")[:k]]


def choose_decodes(policy: Policy, view: SchedulerView, ready: np.ndarray, *, decode_slots: int,
                   wait_cap: int, step: int, last_served: np.ndarray) -> tuple[np.ndarray, int]:
    """Rows that decode this step and how many of them the wait cap forced (listed first).

    A request not served for more than ``wait_cap`` steps (``step - last_served > wait_cap``) is
    forced in; if more are starving than there are slots, the longest-starved win. ``wait_cap`` 0
    turns forcing off. Everything fits when ``len(ready) <= decode_slots``.
    """
    if len(ready) <= decode_slots:
        return ready, 0
    n_forced = 0
    if wait_cap:
        starving = (step - last_served[ready]) > wait_cap
        n_forced = int(starving.sum())
    if n_forced:
        forced = ready[starving]
        if n_forced >= decode_slots:
            forced = forced[np.argsort(last_served[forced], kind="stable")[:decode_slots]]
            return forced, decode_slots
        picked = rank(policy, view, ready[~starving], decode_slots - n_forced)
        return np.concatenate([forced, picked]), n_forced
    return rank(policy, view, ready, decode_slots), 0


def victim_order(policy: Policy, view: SchedulerView, ready: np.ndarray, chosen: np.ndarray,
                 n_forced: int) -> np.ndarray:
    """Every row of ``ready`` in the order a KV shortage spares them (docs/semantics.md "KV blocks" 3):
    the step's decodes first (the wait cap's forced ones as ``choose_decodes`` lists them, then the
    rest of ``chosen`` in the policy's order), then the residents not chosen in the policy's order.
    The policy's order is its ``victim_keys`` where it declares them, else its decode keys.
    Decodes ask for blocks from the front and the last row not yet preempted is the next victim, so a
    forced decode is spared while any request the policy ranks behind it remains, and no victim has
    been served its block already: vLLM's running queue read from the front and popped from the back
    (``live.scheduler`` hands vLLM exactly this order)."""
    keys = policy.victim_keys(view, ready)   # the policy's KV victim rule, if it has its own
    ranked = rank(policy, view, ready, len(ready)) if keys is None else ready[np.argsort(keys, kind="stable")]
    forced = chosen[:n_forced]
    picked = np.isin(ranked, chosen)
    return np.concatenate([forced, ranked[picked & ~np.isin(ranked, forced)], ranked[~picked]])
