"""core.metrics: hand-computed values and brute force on small inputs."""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # only effective if numpy is not imported yet

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.metrics import (
    average_ranks,
    bucket_counts,
    kendall_tau_b,
    mae_by_bucket,
    pairwise_order_accuracy,
    rank_metrics,
    spearman,
)
from core.patience import scaled


def brute_ranks(x):
    x = np.asarray(x, dtype=float)
    return np.array([1 + (x < v).sum() + ((x == v).sum() - 1) / 2 for v in x])


def brute_spearman(a, b):
    ra, rb = brute_ranks(a), brute_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt((ra @ ra) * (rb @ rb))
    return math.nan if den == 0 else (ra @ rb) / den


def brute_signs(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    i, j = np.triu_indices(len(a), 1)
    return np.sign(a[i] - a[j]), np.sign(b[i] - b[j])


def brute_tau_b(a, b):
    sa, sb = brute_signs(a, b)
    den = math.sqrt((sa != 0).sum() * (sb != 0).sum())
    return math.nan if den == 0 else (sa * sb).sum() / den


def brute_pairwise(pred, true):
    sp, st_ = brute_signs(pred, true)
    m = st_ != 0
    if not m.any():
        return math.nan
    return ((sp == st_)[m].sum() + 0.5 * (sp == 0)[m].sum()) / m.sum()


def same(x, y, tol=1e-12):
    return (math.isnan(x) and math.isnan(y)) or abs(x - y) <= tol


def test_hand_computed_values():
    a = [1, 2, 3, 4, 5]
    b = [5, 6, 7, 8, 7]
    # ranks of b: 1, 2, 3.5, 5, 3.5 -> rho = 8 / sqrt(10 * 9.5)
    assert spearman(a, b) == pytest.approx(8 / math.sqrt(95), abs=1e-15)
    # 8 concordant, 1 discordant, one tie in b: tau_b = 7 / sqrt(10 * 9)
    assert kendall_tau_b(a, b) == pytest.approx(7 / math.sqrt(90), abs=1e-15)
    # 9 pairs with distinct true values, 8 ordered right
    assert pairwise_order_accuracy(a, b) == pytest.approx(8 / 9)
    # a prediction tie counts one half
    assert pairwise_order_accuracy([1, 1, 2], [1, 2, 3]) == pytest.approx(2.5 / 3)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert list(average_ranks([10, 20, 20, 5])) == [2.0, 3.5, 3.5, 1.0]


def test_undefined_cases_are_nan():
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(kendall_tau_b([1, 2, 3], [4, 4, 4]))
    assert math.isnan(spearman([1], [2]))
    assert math.isnan(pairwise_order_accuracy([1, 2], [3, 3]))
    with pytest.raises(ValueError):
        spearman([1, 2], [1, 2, 3])
    with pytest.raises(ValueError):
        kendall_tau_b([1, np.nan], [1, 2])


def test_mae_by_bucket_hand_computed():
    pred = [100, 300, 2000, 10]
    true = [200, 500, 1500, 256]
    out = mae_by_bucket(pred, true)
    assert out["overall"] == pytest.approx((100 + 200 + 500 + 246) / 4)
    assert out["<=256"] == pytest.approx((100 + 246) / 2)
    assert out["257-1024"] == pytest.approx(200)
    assert out[">1024"] == pytest.approx(500)
    empty = mae_by_bucket([1, 2], [3, 4])
    assert math.isnan(empty[">1024"]) and math.isnan(empty["257-1024"])
    assert bucket_counts([1, 256, 257, 1024, 1025]) == {"overall": 5, "<=256": 2, "257-1024": 2, ">1024": 1}
    m = rank_metrics(pred, true)
    assert m["n"] == 4 and m["mae_le256"] == pytest.approx(173)


small_ints = st.lists(st.integers(0, 5), min_size=2, max_size=25)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_against_brute_force(data):
    a = data.draw(small_ints)
    b = data.draw(st.lists(st.integers(0, 5), min_size=len(a), max_size=len(a)))
    assert same(spearman(a, b), brute_spearman(a, b))
    assert same(kendall_tau_b(a, b), brute_tau_b(a, b))
    assert same(pairwise_order_accuracy(a, b), brute_pairwise(a, b))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=40), st.randoms())
def test_against_brute_force_floats(a, rnd):
    b = [x + rnd.uniform(-1e5, 1e5) for x in a]
    assert same(spearman(a, b), brute_spearman(a, b), 1e-9)
    assert same(kendall_tau_b(a, b), brute_tau_b(a, b), 1e-12)


def test_kendall_20k_is_fast():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(20_000)
    y = np.round(x + rng.standard_normal(20_000), 1)      # with many ties
    start = time.perf_counter()
    tau = kendall_tau_b(x, y)
    assert time.perf_counter() - start < scaled(2.0)      # O(n log n): an O(n^2) pass takes far longer
    # check against blocked brute force on a subsample
    sub = slice(0, 1500)
    assert kendall_tau_b(x[sub], y[sub]) == pytest.approx(brute_tau_b(x[sub], y[sub]), abs=1e-12)
    assert 0.4 < tau < 0.8
