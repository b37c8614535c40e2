"""The compiled kernel's KV blocks, beside their twin in the reference (:mod:`simulator.kv_blocks`,
``Scheduler._grow``; docs/semantics.md "KV blocks"; no prefix caching).

The block arithmetic and the rule of a step short of blocks are :mod:`simulator.kv_rule`'s plain
functions, which the reference calls too. Here: the victim order the kernel hands that rule
(``policies.selection.victim_order`` from the kernel's standing orders), a preempted row's
bookkeeping, and its leaving the residents, the step's decodes and the kernel's standing orders
(row order, (key, row) order, the list by last service). The admission of re-queued rows and the
re-prefills' completion sit in :mod:`simulator.kernel_steps` (``_admit``, ``_prefill``, ``_land``).
Plain Python that numba compiles (inlined into the step).
"""

from __future__ import annotations

import numpy as np

from simulator.kernel_layout import KEY_ROW
from simulator.kernel_order import _lru_remove
from simulator.kernel_policies import _ltr_decode_keys
from simulator.kernel_prefix import _pk_grant, _pk_name_decodes, _pk_spare
from simulator.kernel_rank import _rank
from simulator.kv_rule import blocks_for as _blocks_for
from simulator.kv_rule import spare as _spare


def _kv_victim_order(t, w, s, st, b):
    """policies.selection.victim_order into ``kv_order[:n_res]``: the forced decodes, the other
    decodes in the policy's order, then the residents not decoding in the policy's order (every
    resident ranked by :func:`simulator.kernel_rank._rank`: the policy asked for all residents' keys)."""
    n_res, chosen, order, mark = st.n_res, w.chosen, w.kv_order, w.kv_mark
    if s.promotes:   # LTRStarvation.decode_keys over every resident (as the reference's rank asks)
        _ltr_decode_keys(t, w, s, st, w.resident, n_res)
    _rank(t, w, s, st, w.resident, n_res, 0, n_res, False, w.scratch)
    for j in range(b.n_chosen):
        mark[chosen[j]] = 1 if j < b.n_forced else 2
    m = 0
    for j in range(b.n_forced):
        order[m] = chosen[j]
        m += 1
    for j in range(n_res):
        if mark[w.scratch[j]] == 2:
            order[m] = w.scratch[j]
            m += 1
    for j in range(n_res):
        if mark[w.scratch[j]] == 0:
            order[m] = w.scratch[j]
            m += 1
    for j in range(b.n_chosen):
        mark[chosen[j]] = 0


def _kv_grow(t, w, s, st, b):
    """Scheduler._grow (KVBlocks.grow_decodes): each decode of the step takes the block its next
    token needs; in a step short of blocks the victims (:func:`simulator.kv_rule.spare`; with prefix
    caching :func:`simulator.kernel_prefix._pk_spare`) are preempted: re-queued (the last preempted
    on top), their next prefill their prompt and generated tokens, and they leave the decodes, the
    residents and the standing orders."""
    b.n_preempted = 0
    if s.kv_caches:
        if not _pk_grant(t, w, s, st, b):
            _kv_victim_order(t, w, s, st, b)
            _kv_requeue(t, w, s, st, b, _pk_spare(t, w, s, st, b))
        _pk_name_decodes(t, w, s, b)
        return
    need, held = 0, w.kv_held
    for j in range(b.n_chosen):
        r = w.chosen[j]
        need += _blocks_for(t.prompt[r] + t.generated[r], s.kv_size) - held[r]
    if need <= s.kv_total - st.kv_blocks_used:
        for j in range(b.n_chosen):
            r = w.chosen[j]
            held[r] = _blocks_for(t.prompt[r] + t.generated[r], s.kv_size)
        st.kv_blocks_used += need
        return
    _kv_victim_order(t, w, s, st, b)
    n_gone, used = _spare(w.kv_order[:st.n_res], b.n_chosen, t.prompt, t.generated, held, w.kv_recompute,
                          s.kv_size, st.kv_blocks_used, s.kv_total, w.kv_gone)
    st.kv_blocks_used = used
    _kv_requeue(t, w, s, st, b, n_gone)


def _kv_requeue(t, w, s, st, b, n_gone):
    """KVBlocks._requeue of the step's ``n_gone`` victims (``kv_gone``), then they leave (:func:`_kv_leave`)."""
    for j in range(n_gone):
        r = w.kv_gone[j]
        t.fill[r] = t.prompt[r] + t.generated[r]
        t.prefilled[r] = 0
        t.preemptions[r] += 1
        w.kv_requeue[st.n_requeued] = r
        st.n_requeued += 1
    st.preemptions += n_gone
    b.n_preempted = n_gone
    _kv_leave(t, w, s, st, b)


def _kv_leave(t, w, s, st, b):
    """The step's preempted rows (``kv_recompute`` set) leave the decodes (the forced ones counted
    again), the residents, the (key, row) order and the list by last service."""
    m, forced = 0, 0
    for j in range(b.n_chosen):
        r = w.chosen[j]
        if not w.kv_recompute[r]:
            w.chosen[m] = r
            m += 1
            if j < b.n_forced:
                forced += 1
    b.n_chosen, b.n_forced = m, forced
    m = 0
    for j in range(st.n_res):
        r = w.resident[j]
        if not w.kv_recompute[r]:
            w.resident[m] = r
            m += 1
    if s.keys_on != KEY_ROW:
        m = 0
        for j in range(st.n_res):
            r = w.ord_rows[j]
            if not w.kv_recompute[r]:
                w.ord_rows[m], w.ord_keys[m] = r, w.ord_keys[j]
                m += 1
    head, tail = st.lru_head, st.lru_tail
    for j in range(b.n_preempted):
        head, tail = _lru_remove(w.kv_gone[j], w.lru_prev, w.lru_next, head, tail)
    st.lru_head, st.lru_tail = head, tail
    st.n_res -= b.n_preempted


def kv_arrays(n: int, width: int) -> dict[str, np.ndarray]:
    """The KV blocks' working arrays (:class:`simulator.kernel_layout.Work`) for ``n`` rows and
    ``width`` resident places (``n`` 0: no KV blocks, one element each)."""
    rows = max(n, 1)
    return {"kv_held": np.zeros(rows, dtype=np.int64), "kv_recompute": np.zeros(rows, dtype=np.bool_),
            "kv_requeue": np.empty(rows, dtype=np.int64), "kv_mark": np.zeros(rows, dtype=np.int64),
            "kv_order": np.empty(width if n else 1, dtype=np.int64), "kv_gone": np.empty(width if n else 1, dtype=np.int64),
            "readmit": np.empty(width, dtype=np.int64), "resumed": np.empty(width + 1, dtype=np.int64)}


def kv_fill(table, bounded: bool) -> np.ndarray:
    """Each row's next prefill (``Rows.fill``): without KV blocks the prompt array itself (nothing
    rewrites it), else the table's own copy (RequestTable.fill, as the reference's first preemption
    makes it), which the kernel writes at each preemption."""
    if bounded and table.fill is table.prompt:
        table.fill, table.fill_sq = table.prompt.copy(), table.prompt_sq.copy()
    return table.fill


JITTED = ("_blocks_for", "_spare", "_kv_victim_order", "_kv_grow", "_kv_requeue", "_kv_leave")
