"""LEAP+RLS's estimate of one request from the published weights, written once as a loop.

The reference predictor (:meth:`predictors.leap.online.LeapRLS.predict`: the rows a prefill
completes, every resident at a publish) and the compiled kernel (:mod:`simulator.kernel_online`:
the prefill estimates inside compiled code) call this same function, so their estimates are the
same bits. numba compiles it when installed (:func:`load`); without numba it runs as the plain
Python below, the same float64 operations in the same order (``tests/test_online_rule.py``).

The estimate: ``lin = z . theta[:-1] + theta[-1]`` over the row's standardised float32 features
(each widened to float64 exactly), summed in four interleaved partial sums
``((s0 + s1) + (s2 + s3))`` then the tail, clipped to the target's range ``[lo, hi]``, mapped back
to tokens (``square``: ``v * v``; else the identity) and clipped to ``[1, cap]``.
"""

from __future__ import annotations

import numpy as np

from core.jit import cached_per_numba


def estimate_row(Z, r, theta, square, lo, hi, cap):
    """Row ``r``'s length estimate (tokens) under weights ``theta`` (bias last)."""
    d = Z.shape[1]
    s0 = s1 = s2 = s3 = 0.0
    top = d - d % 4
    for j in range(0, top, 4):
        s0 += float(Z[r, j]) * theta[j]
        s1 += float(Z[r, j + 1]) * theta[j + 1]
        s2 += float(Z[r, j + 2]) * theta[j + 2]
        s3 += float(Z[r, j + 3]) * theta[j + 3]
    lin = (s0 + s1) + (s2 + s3)
    for j in range(top, d):
        lin += float(Z[r, j]) * theta[j]
    lin += theta[d]
    if lin < lo:
        lin = lo
    if lin > hi:
        lin = hi
    out = lin * lin if square else lin
    if out < 1.0:
        out = 1.0
    if out > cap:
        out = cap
    return out


def estimate_rows(Z, rows, theta, square, lo, hi, cap, out):
    for j in range(rows.shape[0]):
        out[j] = estimate_row(Z, rows[j], theta, square, lo, hi, cap)


RULES = ("estimate_row", "estimate_rows")


@cached_per_numba
def load() -> bool:
    """Compile the rule with numba in place (True), or keep the plain Python (False, no numba)."""
    from core.jit import compile_in_place

    return compile_in_place(globals(), RULES, __file__)


def estimates(Z: np.ndarray, rows: np.ndarray, theta: np.ndarray, square: bool, lo: float, hi: float,
              cap: float) -> np.ndarray:
    """:func:`estimate_row` of each of ``rows`` (compiled when numba is installed)."""
    load()
    out = np.empty(len(rows))
    estimate_rows(Z, np.ascontiguousarray(rows, dtype=np.int64), theta, bool(square), float(lo), float(hi),
                  float(cap), out)
    return out
