"""The compiled kernel's policy keys: each policy's rule beside its twin in ``policies/``.

The kernel keeps residents in a standing (key, row) order and waiting rows in a (key, row) heap
(:mod:`simulator.kernel_order`); this module says what the keys are and when they move. Countdown's
keys (``_key``) move only when a row decodes or gets a new estimate. Two policies move them at other
times, and the kernel re-keys exactly then:

- aging (``policies.aging.Aging``): every key depends on the aging clock, floor(now / 5 s) x 5 s,
  so when it ticks every resident and every waiting row is re-keyed (:func:`_aging_tick`); between
  ticks a key moves only as countdown's does. The key is the policy's own ``aged_key``, compiled in.
- LTR's starvation rule (``policies.ltr_starvation.LTRStarvation``): its per-row state
  (``runs_left``, ``served_seen``, ``first_waiting``: the policy's own arrays) changes only when the
  reference asks the policy for keys, so the kernel runs the same updates (the policy's own
  ``decode_row`` and ``promote_waiting``, compiled in) at the same calls: decode
  keys when more rows are ready than there are slots and the wait cap leaves a slot to rank
  (:func:`simulator.kernel_steps._choose_decodes`), admission keys whenever admission is ordered and
  has room, budget and a waiting row (:func:`simulator.kernel_steps._admit`). A promoted row's key
  is its countdown key - 1e12.

Plain Python that numba compiles (inlined into the step, :func:`simulator.kernel.load_kernel`).
"""

from __future__ import annotations

import math
from typing import Any

from policies.aging import aged_key as _aged
from policies.ltr_starvation import PROMOTED_OFFSET, UNSEEN
from policies.ltr_starvation import decode_row as _ltr_decode_row
from policies.ltr_starvation import promote_waiting as _ltr_promote_waiting
from simulator.kernel_layout import KEY_SCORE
from simulator.kernel_order import _heapify, _insertion_sort, _key, _rekey_sort, _sift_down, _sift_up

_rule_admission_key: Any = None   # the policy's rule (policies/rule.py), bound by simulator.kernel.load_kernel


def _decode_key(r, t, w, s, st):
    """The policy's decode key of row ``r``: countdown's (policies.countdown.remaining; ``_key``),
    aged at the stored aging clock (Aging.decode_keys) or put first while promoted
    (LTRStarvation.decode_keys)."""
    return _policy_key(_key(r, t, s.keys_on), r, t, w, s, st)


def _admission_key(r, t, w, s, st):
    """The policy's admission key of row ``r``: its estimate (Countdown.admission_keys, SSJF's
    outside its override), aged (Aging.admission_keys) or put first while promoted
    (LTRStarvation.admission_keys)."""
    return _policy_key(_rule_admission_key(r, t, s.keys_on == KEY_SCORE), r, t, w, s, st)


def _policy_key(key, r, t, w, s, st):
    """Row ``r``'s base ``key`` as the policy leaves it: aged at the stored aging clock (Aging.aged)
    or put first while promoted (LTRStarvation: ``base - PROMOTED_OFFSET``)."""
    if s.aging:
        return _aged(key, t.arrival[r], st.aging_clock, s.aging_log_rate)
    if s.promotes and w.runs_left[r] > 0:
        return key - PROMOTED_OFFSET
    return key


def _policy_rekey_sort(t, w, s, st, n):
    """Re-key ``ord_rows[:n]`` with :func:`_decode_key` and restore its (key, row) order; countdown's
    keys by ``kernel_order._rekey_sort`` (a compact loop of its own: through this one, countdown's
    compiled step ran 1.3x slower)."""
    if not (s.aging or s.promotes):
        _rekey_sort(w.ord_keys, w.ord_rows, n, t, s.keys_on)
        return
    for i in range(n):
        w.ord_keys[i] = _decode_key(w.ord_rows[i], t, w, s, st)
    _insertion_sort(w.ord_keys, w.ord_rows, n)


def _aging_clock(now, every):
    """Aging.aged's clock: floor(now / every) x every."""
    return math.floor(now / every) * every


def _aging_tick(t, w, s, st, clock):
    """The aging clock moved to ``clock`` since the standing orders were keyed: every resident and
    every waiting row is re-keyed (the reference recomputes every key at every call; between ticks
    its keys move only where countdown's do)."""
    st.aging_clock = clock
    _policy_rekey_sort(t, w, s, st, st.n_res)
    for i in range(st.heap):
        w.heap_keys[i] = _admission_key(w.heap_rows[i], t, w, s, st)
    _heapify(w.heap_keys, w.heap_rows, st.heap)


def _ltr_decode_keys(t, w, s, st, rows, n_rows):
    """LTRStarvation.decode_keys over the decision's ``rows[:n_rows]``: the runs of promoted rows
    since the policy last looked, then rows idle for ``promote_after_idle`` steps promoted; the
    standing order is re-sorted when a row's promotion changed."""
    changed = False
    for j in range(n_rows):
        if _ltr_decode_row(rows[j], st.step, t.last_served, w.runs_left, w.served_seen, s.promote_after_idle,
                           s.promoted_runs):
            changed = True
    if changed:
        _policy_rekey_sort(t, w, s, st, st.n_res)


def _ltr_admission_keys(t, w, s, st):
    """LTRStarvation.admission_keys over every waiting row: each counts its wait from the first
    call that saw it waiting, and one waiting ``promote_after_idle`` steps is promoted (its heap
    key moves). Rows are seen in row order, so their first calls are too: the waiting rows due a
    promotion are the first ones, and a pointer passes each once."""
    step = st.step
    for r in range(st.ltr_seen, st.arrived):
        if not t.admitted[r] and w.first_waiting[r] == UNSEEN:
            w.first_waiting[r] = step
    st.ltr_seen = st.arrived
    p = st.ltr_idle_ptr
    while p < st.arrived:
        if not t.admitted[p]:
            if step - w.first_waiting[p] < s.promote_after_idle:
                break
            if _ltr_promote_waiting(p, step, w.first_waiting, w.runs_left, w.served_seen, s.promote_after_idle,
                                    s.promoted_runs):
                _heap_rekey(w.heap_keys, w.heap_rows, st.heap, p, _admission_key(p, t, w, s, st))
        p += 1
    st.ltr_idle_ptr = p


def _heap_rekey(hk, hr, size, row, key):
    """Give ``row``'s entry in the (key, row) heap a new key."""
    for i in range(size):
        if hr[i] == row:
            hk[i] = key
            _sift_up(hk, hr, i)
            _sift_down(hk, hr, size, i)
            return


JITTED = ("_ltr_decode_row", "_ltr_promote_waiting", "_aged", "_policy_key", "_decode_key", "_admission_key",
          "_policy_rekey_sort", "_aging_clock", "_aging_tick", "_ltr_decode_keys", "_ltr_admission_keys",
          "_heap_rekey")
#: inlined into the step (the keys, on every path); the rest are called, so that their bodies, run only
#: by aging and LTR, do not weigh on the other policies' compiled step (inlined, countdown ran 1.3x slower)
INLINED = ("_aged", "_policy_key", "_decode_key", "_admission_key", "_policy_rekey_sort", "_aging_clock")
