"""The compiled kernel's float arithmetic: CPython's and numpy's rules replicated bit for bit.

The reference engine times a step with ``math.hypot`` (the roofline profile) and sums decode errors
with numpy's pairwise sum; the kernel (:mod:`simulator.kernel`) must produce the same float64
results, so both are written out here in the order CPython and numpy add. Plain Python that numba
compiles (:func:`simulator.kernel.load_kernel`).
"""

from __future__ import annotations

import math

import numpy as np

from simulator.kernel_layout import PROFILE_FITTED, PROFILE_ROOFLINE, PROFILE_UNIT


def _dl_split(x):
    t = x * 134217729.0
    hi = t - (t - x)
    return hi, x - hi


def _dl_mul(x, y):
    xh, xl = _dl_split(x)
    yh, yl = _dl_split(y)
    p = xh * yh
    q = xh * yl + xl * yh
    z = p + q
    zz = p - z + q + xl * yl
    return z, zz


def _py_hypot(a, b):
    """CPython 3.11's math.hypot of two finite floats (vector_norm), bit for bit."""
    a, b = abs(a), abs(b)
    mx = a if a > b else b
    if mx == 0.0:
        return mx
    _, max_e = math.frexp(mx)
    if max_e < -1023:
        return math.hypot(a, b)     # subnormal range: not reached by step times
    scale = math.ldexp(1.0, -max_e)
    csum, frac1, frac2 = 1.0, 0.0, 0.0
    for x in (a, b):
        x *= scale
        ph, pl = _dl_mul(x, x)
        s = csum + ph
        sl = (csum - s) + ph
        csum = s
        frac1 += pl
        frac2 += sl
    h = math.sqrt(csum - 1.0 + (frac1 + frac2))
    ph, pl = _dl_mul(-h, h)
    s = csum + ph
    sl = (csum - s) + ph
    csum = s
    frac1 += pl
    frac2 += sl
    x = csum - 1.0 + (frac1 + frac2)
    h += x / (2.0 * h)
    return h / scale


def _pairwise(a, lo, n, stack, sums):
    """numpy's pairwise float64 sum of a[lo:lo+n] (its add.reduce of a contiguous array). numpy
    recurses on halves above 128; here that walk runs on a stack (the same additions in the same
    order), because numba cannot reload a cached recursive function (it segfaults, numba#6061).
    ``stack`` (int64, 3 x 64) and ``sums`` (float64, 64) are the caller's: the kernel allocates nothing."""
    if n <= 128:
        return _pairwise_block(a, lo, n)
    starts, sizes, stages = stack[0], stack[1], stack[2]   # depth < 64 for any int64 n
    stages[0] = 0
    starts[0], sizes[0], top, n_sums = lo, n, 0, 0
    while top >= 0:
        m = sizes[top]
        if m <= 128:
            sums[n_sums] = _pairwise_block(a, starts[top], m)
            n_sums += 1
            top -= 1
            continue
        n2 = m // 2
        n2 -= n2 % 8
        if stages[top] < 2:                    # push the left half, then the right one
            first = stages[top] == 0
            stages[top] += 1
            starts[top + 1] = starts[top] if first else starts[top] + n2
            sizes[top + 1] = n2 if first else m - n2
            stages[top + 1] = 0
            top += 1
        else:                                  # both halves summed: left + right, as numpy adds them
            sums[n_sums - 2] = sums[n_sums - 2] + sums[n_sums - 1]
            n_sums -= 1
            top -= 1
    return sums[0]


def _pairwise_block(a, lo, n):
    """numpy's sum of at most 128 values: in order below 8, else eight interleaved partial sums."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - (n % 8):
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


def _step_time(kind, pi, pf, prefill_tokens, prefill_sq, decode_batch, decode_context):
    """The engine profile's ``step_time`` (``simulator/profiles/``: roofline, fitted, unit) from the
    coefficients it declares (``compiled_coefficients``)."""
    if kind == PROFILE_ROOFLINE:
        tokens = prefill_tokens + decode_batch
        mem = float(pi[0] + pi[1] * decode_context) / pf[0]
        comp = (pf[1] * tokens + pf[2] * decode_batch + pf[3] * prefill_sq + pf[4] * decode_context) / pf[5]
        return pf[6] + _py_hypot(mem, comp)
    if kind == PROFILE_FITTED:
        t = pf[0] + pf[1] * prefill_tokens + pf[2] * decode_batch + pf[3] * decode_context + pf[4] * prefill_sq
        return t if t > 1e-9 else 1e-9
    return 1.0


_PROFILE_FORMS = {"roofline": PROFILE_ROOFLINE, "fitted": PROFILE_FITTED, "unit": PROFILE_UNIT}


def profile_coefficients(profile) -> tuple[int, np.ndarray, np.ndarray]:
    """(kernel form, integer coefficients, float coefficients) from the profile's own declaration."""
    declared = profile.compiled_coefficients()
    if declared is None:
        raise TypeError(f"engine profile {profile.name!r} declares no compiled form")
    form, ints_in, floats_in = declared
    ints, floats = np.zeros(2, dtype=np.int64), np.zeros(8, dtype=np.float64)
    ints[:len(ints_in)], floats[:len(floats_in)] = ints_in, floats_in
    return _PROFILE_FORMS[form], ints, floats


JITTED = ("_dl_split", "_dl_mul", "_py_hypot", "_pairwise_block", "_pairwise", "_step_time")
