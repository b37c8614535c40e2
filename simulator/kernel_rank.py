"""The compiled kernel's decode ranking: ``policies.selection.rank`` over the standing orders.

Used by the decode choice (:func:`simulator.kernel_steps._choose_decodes`) and by a KV shortage's
victim order (:func:`simulator.kernel_kv._kv_victim_order`). Plain Python that numba compiles.
"""

from __future__ import annotations

from policies.ssjf_starvation import starving_row
from policies.trail_preemption import LOCKED_KEY
from policies.trail_preemption import locked_row as _locked
from simulator.kernel_layout import KEY_ROW
from simulator.kernel_order import _before


def _starving(t, s, now, j):
    """SSJFStarvation.starving of a decision whose longest-waiting row is ``j`` (rows are in arrival
    order, so it is the decision's first row): the policy's own ``starving_row``, compiled in."""
    return starving_row(now - t.arrival[j], t.predicted[j], s.starve_after_s, s.starve_factor, s.exec_base_s,
                        s.exec_per_token_s)


def _rank(t, w, s, st, candidates, n_cand, at, k, skip_starving, chosen):
    """policies.selection.rank: the first ``k`` of ``candidates[:n_cand]`` by the policy's decode
    keys, into ``chosen[at:at + k]`` (the step's decodes, or another buffer). Row order (FCFS); else the (key, row) order of every resident
    (``ord_rows``), skipping the starving (not among the candidates), with TRAIL's locked rows at
    its ``LOCKED_KEY`` (first, whatever a rank predictor's scores are: only a key of -inf ties with
    it) merged in; SSJF's override, when its first row starves: row (arrival) order. True when the
    choice is that order's prefix."""
    step = st.step
    if s.keys_on == KEY_ROW or (s.starvation_override and n_cand and _starving(t, s, st.now, candidates[0])):
        for j in range(k):
            chosen[at + j] = candidates[j]
        return False
    lock = s.lock_after >= 0.0
    if not lock and not skip_starving:
        for j in range(k):
            chosen[at + j] = w.ord_rows[j]
        return True
    # the locked candidates (key LOCKED_KEY, row order) merged into the (key, row) order of the rest
    m, i = 0, 0
    held = _next_locked(t, s, step, candidates, n_cand, 0) if lock else n_cand
    while m < k:
        if held < n_cand and (i >= st.n_res or _before(LOCKED_KEY, candidates[held], w.ord_keys[i], w.ord_rows[i])):
            chosen[at + m] = candidates[held]
            m += 1
            held = _next_locked(t, s, step, candidates, n_cand, held + 1)
            continue
        r = w.ord_rows[i]
        i += 1
        if skip_starving and step - t.last_served[r] > s.wait_cap:
            continue
        if lock and _locked(r, step, s.lock_after, t.last_served, t.generated, t.first_predicted):
            continue
        chosen[at + m] = r
        m += 1
    return False


def _next_locked(t, s, step, candidates, n_cand, j):
    """The index of the first locked row of ``candidates[j:n_cand]`` (``n_cand``: none)."""
    while j < n_cand and not _locked(candidates[j], step, s.lock_after, t.last_served, t.generated,
                                     t.first_predicted):
        j += 1
    return j


JITTED = ("starving_row", "_starving", "_locked", "_rank", "_next_locked")
