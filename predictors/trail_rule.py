"""TRAIL's per-request rules (Bayesian smoothing, the estimate, the prefill and decode observations)
written once, as plain loops over one request's row.

The reference predictor (:class:`predictors.trail.Trail`) and the compiled kernel
(:mod:`simulator.kernel_trail`) call these same functions, so their estimates are the same bits:
numba compiles them when it is installed (:func:`load`); without it they run as the plain Python
below, which performs the same float64 operations in the same order (scalar multiply, then add; no
fused multiply-add), so the bits do not depend on numba either (``tests/test_trail_rule.py``).
Nothing here allocates (the compiled kernel runs without numba's reference counts): the posterior
works in a caller's ``scratch`` of ``2 k`` floats.

The rule (TRAIL's ``trail_predictor.py``; see :mod:`predictors.trail`): an observation with
likelihood ``lik`` after ``s`` tokens multiplies ``prior = post @ T^s`` by ``lik`` and renormalises
(the prior is kept when the product sums to no positive number); the estimate after ``g`` generated
tokens is ``g + clip((post @ T^(g - g_post)) @ mid, 1, max(cap - g, 1))``. Sums run in index order.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from core.jit import cached_per_numba


class TrailArrays(NamedTuple):
    """One bound TRAIL's state and tables, shared (the same arrays) by the predictor and the kernel."""

    post: np.ndarray         # (n, k) posterior over bins of each request
    g_post: np.ndarray       # (n,) generated count the posterior refers to
    prefilled: np.ndarray    # (n,) the prefill observation is folded in
    used_g: np.ndarray       # (n,) generated count of the last decode vector folded in (0: none)
    total: np.ndarray        # (n,) the current total-length estimate
    prefill_lik: np.ndarray  # (n, k) the probe's bin probabilities from each prompt's prefill state
    dec_key: np.ndarray      # (m,) (row << 32) | generated of each recorded decode vector, sorted
    dec_gen: np.ndarray      # (m,) generated count of each decode vector
    dec_lik: np.ndarray      # (m, k) the probe's bin probabilities from each decode vector
    vec_start: np.ndarray    # (n,) each row's first decode vector (index into dec_*)
    powers: np.ndarray       # (cap + 1, k, k) T^s for s = 0 .. cap
    mid: np.ndarray          # (k,) bin midpoints
    cap: float               # the run's output cap M_w
    scratch: np.ndarray      # (2 k,) working floats


def observe_row(r, at_g, lik, li, a):
    """Fold the likelihood ``lik[li]``, observed after ``at_g`` generated tokens, into row ``r``'s
    posterior (``smooth`` in :mod:`predictors.trail`)."""
    post, k, prior = a.post, a.post.shape[1], a.scratch
    step = a.powers[at_g - a.g_post[r]]
    for j in range(k):
        acc = 0.0
        for i in range(k):
            acc += post[r, i] * step[i, j]
        prior[j] = acc
    total = 0.0
    for j in range(k):
        v = prior[j] * lik[li, j]
        prior[k + j] = v
        total += v
    if total > 0.0:
        for j in range(k):
            post[r, j] = prior[k + j] / total
    else:   # a likelihood with no overlap: keep the prior (never for a softmax)
        for j in range(k):
            post[r, j] = prior[j]
    a.g_post[r] = at_g


def estimate_row(r, g, a):
    """Row ``r``'s total-length estimate after ``g`` generated tokens."""
    post, k = a.post, a.post.shape[1]
    s = g - a.g_post[r]
    val = 0.0
    if s > 0:
        step = a.powers[s]
        for j in range(k):
            acc = 0.0
            for i in range(k):
                acc += post[r, i] * step[i, j]
            val += acc * a.mid[j]
    else:
        for j in range(k):
            val += post[r, j] * a.mid[j]
    upper = a.cap - g
    if upper < 1.0:
        upper = 1.0
    if val < 1.0:
        val = 1.0
    if val > upper:
        val = upper
    return g + val


def prefill_row(r, a):
    """The prefill observation of row ``r`` (at generated 1), once."""
    if not a.prefilled[r]:
        observe_row(r, 1, a.prefill_lik, r, a)
        a.prefilled[r] = True


def after_prefill_row(r, a):
    """``Trail.after_prefill`` for one row: fold in its prefill state; its estimate at generated 1."""
    prefill_row(r, a)
    a.total[r] = estimate_row(r, 1, a)


def latest_vector(key, a):
    """Index of the last decode vector whose key is <= ``key`` (-1: none): ``searchsorted(right) - 1``."""
    lo, hi = 0, a.dec_key.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if a.dec_key[mid] <= key:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def refresh_row(r, g, a):
    """``Trail.refresh`` for one row after ``g`` generated tokens: the prefill observation if it is
    missing, then the latest recorded decode vector at or below ``g`` if newer than the last one
    used; the estimate is recomputed only when new evidence came in."""
    just_prefilled = not a.prefilled[r]
    prefill_row(r, a)
    pick = latest_vector((r << 32) | g, a)
    fresh = pick >= a.vec_start[r] and a.dec_gen[pick] > a.used_g[r]
    if fresh:
        at = a.dec_gen[pick]
        observe_row(r, at, a.dec_lik, pick, a)
        a.used_g[r] = at
    if fresh or just_prefilled:
        a.total[r] = estimate_row(r, g, a)


def estimate_rows(rows, generated, a):
    """``estimate_row`` of each row, into ``a.total``."""
    for j in range(rows.shape[0]):
        a.total[rows[j]] = estimate_row(rows[j], generated[j], a)


def after_prefill_rows(rows, a):
    for j in range(rows.shape[0]):
        after_prefill_row(rows[j], a)


def refresh_rows(rows, generated, a):
    for j in range(rows.shape[0]):
        refresh_row(rows[j], generated[j], a)


#: the functions numba compiles (each call of one by another goes through this module's names)
RULES = ("observe_row", "estimate_row", "prefill_row", "after_prefill_row", "latest_vector", "refresh_row",
         "estimate_rows", "after_prefill_rows", "refresh_rows")


@cached_per_numba
def load() -> bool:
    """Compile the rules with numba in place (True), or keep the plain Python (False, no numba).
    Compiled like the kernel (no reference counts, cached on disk in the kernel's cache folder)."""
    from core.jit import compile_in_place

    return compile_in_place(globals(), RULES, __file__)


def power_table(T: np.ndarray, cap: int) -> np.ndarray:
    """``T^s`` for s = 0 .. cap (``np.linalg.matrix_power``'s bits), as one C-contiguous array."""
    return _power_table(T.tobytes(), T.shape[0], int(cap)).copy()


@functools.lru_cache(maxsize=4)
def _power_table(T_bytes: bytes, k: int, cap: int) -> np.ndarray:
    T = np.frombuffer(T_bytes, dtype=np.float64).reshape(k, k)
    out = np.empty((cap + 1, k, k))
    out[0] = np.eye(k)
    for s in range(1, cap + 1):
        out[s] = np.linalg.matrix_power(T, s)
    return out
