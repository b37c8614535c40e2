"""The compiled kernel's orders: what the reference re-derives by a stable sort each step.

The reference ranks residents by ``np.argsort(keys, kind="stable")`` each step
(:func:`policies.selection.rank`), orders waiting rows the same way for admission
(``Scheduler._admit``) and scans every resident for the wait cap
(:func:`policies.selection.choose_decodes`). The kernel keeps those orders across steps instead:
residents sorted by (key, row) (``Work.ord_rows``; the stable sort's order, ties in row order),
waiting rows in a min-heap by (key, row), residents in a list by last service (its head is the
only one that can starve first). Plain Python that numba compiles.
"""

from __future__ import annotations

from typing import Any

from simulator.kernel_layout import KEY_SCORE

_rule_decode_key: Any = None   # the policy's rule (policies/rule.py), bound by simulator.kernel.load_kernel


def _key(r, t, keys_on):
    """The policy's decode key of row r: its rule's ``decode_key`` (a rank predictor's scores: ``rank``)."""
    return _rule_decode_key(r, t, keys_on == KEY_SCORE)


def _before(ka, ra, kb, rb):
    """(key, row) order: the reference's stable sort by key, ties in row order."""
    return ka < kb or (ka == kb and ra < rb)


def _rekey_sort(ord_keys, ord_rows, n, t, keys_on):
    """Re-key ``ord_rows[:n]`` and restore its (key, row) order by insertion sort: near linear when
    the keys moved little (a decoded prefix, an online update's small shift)."""
    for i in range(n):
        ord_keys[i] = _key(ord_rows[i], t, keys_on)
    for a in range(1, n):
        kr, rr = ord_keys[a], ord_rows[a]
        b = a - 1
        while b >= 0 and _before(kr, rr, ord_keys[b], ord_rows[b]):
            ord_keys[b + 1], ord_rows[b + 1] = ord_keys[b], ord_rows[b]
            b -= 1
        ord_keys[b + 1], ord_rows[b + 1] = kr, rr


def _insertion_sort(ord_keys, ord_rows, n):
    """Restore the (key, row) order of ``ord_rows[:n]`` after its keys moved: near linear when they
    moved little (a decoded prefix, an online update's small shift, an aging clock's tick)."""
    for a in range(1, n):
        kr, rr = ord_keys[a], ord_rows[a]
        b = a - 1
        while b >= 0 and _before(kr, rr, ord_keys[b], ord_rows[b]):
            ord_keys[b + 1], ord_rows[b + 1] = ord_keys[b], ord_rows[b]
            b -= 1
        ord_keys[b + 1], ord_rows[b + 1] = kr, rr


def _ord_insert(ord_keys, ord_rows, n, kr, r):
    """Insert row ``r`` with key ``kr`` into the (key, row)-sorted ``ord_rows[:n]`` (binary search)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if _before(ord_keys[mid], ord_rows[mid], kr, r):
            lo = mid + 1
        else:
            hi = mid
    for i in range(n, lo, -1):
        ord_keys[i], ord_rows[i] = ord_keys[i - 1], ord_rows[i - 1]
    ord_keys[lo], ord_rows[lo] = kr, r


def _lru_append(r, lru_prev, lru_next, head, tail):
    """Row ``r`` to the tail of the residents' list by last service; returns (head, tail)."""
    lru_prev[r], lru_next[r] = tail, -1
    if tail >= 0:
        lru_next[tail] = r
    else:
        head = r
    return head, r


def _lru_remove(r, lru_prev, lru_next, head, tail):
    """Row ``r`` out of the residents' list by last service; returns (head, tail)."""
    p, q = lru_prev[r], lru_next[r]
    if p >= 0:
        lru_next[p] = q
    else:
        head = q
    if q >= 0:
        lru_prev[q] = p
    else:
        tail = p
    return head, tail


def _sift_up(hk, hr, i):
    """Move entry ``i`` of a min-heap by (key, row) up to its place."""
    while i > 0:
        parent = (i - 1) // 2
        if _before(hk[i], hr[i], hk[parent], hr[parent]):
            hk[i], hk[parent] = hk[parent], hk[i]
            hr[i], hr[parent] = hr[parent], hr[i]
            i = parent
        else:
            break


def _sift_down(hk, hr, size, i):
    """Move entry ``i`` of a min-heap by (key, row) of ``size`` entries down to its place."""
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        if left + 1 < size and _before(hk[left + 1], hr[left + 1], hk[left], hr[left]):
            child = left + 1
        if _before(hk[child], hr[child], hk[i], hr[i]):
            hk[i], hk[child] = hk[child], hk[i]
            hr[i], hr[child] = hr[child], hr[i]
            i = child
        else:
            break


def _heap_push(hk, hr, size, key, row):
    # NOTE(speed): _sift_up's and _sift_down's loops written out here on purpose, as countdown's hot
    # path had them before aging/LTR were compiled: with these routed through shared helpers (and the
    # policy keys), its compiled step ran 1.3x slower; the heap's own share was not measured apart
    i = size
    hk[i], hr[i] = key, row
    while i > 0:
        parent = (i - 1) // 2
        if _before(hk[i], hr[i], hk[parent], hr[parent]):
            hk[i], hk[parent] = hk[parent], hk[i]
            hr[i], hr[parent] = hr[parent], hr[i]
            i = parent
        else:
            break
    return size + 1


def _heap_pop(hk, hr, size):
    """Remove the root of a min-heap by (key, row); returns the new size."""
    size -= 1
    hk[0], hr[0] = hk[size], hr[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        if left + 1 < size and _before(hk[left + 1], hr[left + 1], hk[left], hr[left]):
            child = left + 1
        if _before(hk[child], hr[child], hk[i], hr[i]):
            hk[i], hk[child] = hk[child], hk[i]
            hr[i], hr[child] = hr[child], hr[i]
            i = child
        else:
            break
    return size


def _heapify(hk, hr, size):
    """Restore the heap after its keys changed (an aging clock's tick re-keys every waiting row)."""
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(hk, hr, size, i)


JITTED = ("_key", "_before", "_rekey_sort", "_insertion_sort", "_ord_insert", "_lru_append", "_lru_remove", "_sift_up",
          "_sift_down", "_heap_push", "_heap_pop", "_heapify")
