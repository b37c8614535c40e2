"""AnchoredRLS: batch updates reproduce the one-shot ridge solution over training plus feedback."""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # only effective if numpy is not imported yet

import numpy as np
import pytest

from core.readout import penalty_diag, ridge_fit, ridge_system, with_bias
from predictors.leap import AnchoredRLS


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def problem(d, n_train, n_feedback, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d) / np.sqrt(d)
    U = with_bias(rng.standard_normal((n_train, d)))
    y = U[:, :-1] @ w + 3.0 + 0.1 * rng.standard_normal(n_train)
    Uf = with_bias(rng.standard_normal((n_feedback, d)) + 0.5)       # shifted domain
    yf = Uf[:, :-1] @ (w + 0.3 / np.sqrt(d)) + 4.0 + 0.1 * rng.standard_normal(n_feedback)
    return U, y, Uf, yf


@pytest.mark.parametrize("batch", [1, 3, 8, 64])
def test_rls_equals_closed_form_ridge(batch):
    U, y, Uf, yf = problem(d=24, n_train=60, n_feedback=130)
    lam = 2.5
    rls = AnchoredRLS.from_training(U, y, lam)
    assert rel(rls.theta, ridge_fit(U, y, lam)) < 1e-12
    for start in range(0, len(yf), batch):
        rls.update(Uf[start:start + batch], yf[start:start + batch])
    U_all, y_all = np.vstack([U, Uf]), np.r_[y, yf]
    assert rel(rls.theta, ridge_fit(U_all, y_all, lam)) < 1e-8
    A, _ = ridge_system(U_all, y_all, lam)
    assert rel(rls.P, np.linalg.inv(A)) < 1e-8
    P = rls.P
    assert np.array_equal(P, P.T)
    assert rls.updates == -(-len(yf) // batch) and rls.rows_seen == len(yf)


def test_rls_large_d():
    d = 1024
    U, y, Uf, yf = problem(d=d, n_train=40, n_feedback=64, seed=1)    # n << d: the penalty matters
    lam = 5.0
    anchor = AnchoredRLS.from_training(U, y, lam)
    U_all, y_all = np.vstack([U, Uf]), np.r_[y, yf]
    A, r = ridge_system(U_all, y_all, lam)
    theta = np.linalg.solve(A, r)
    for batch in (8, 64):
        rls = AnchoredRLS(anchor.theta, anchor.P)
        for start in range(0, len(yf), batch):
            rls.update(Uf[start:start + batch], yf[start:start + batch])
        assert rel(rls.theta, theta) < 1e-8
        assert rel(rls.P @ A, np.eye(d + 1)) < 1e-8


def test_bias_is_unpenalised_and_constant_features_are_harmless():
    rng = np.random.default_rng(3)
    Z = rng.standard_normal((30, 4))
    Z[:, 2] = 0.0                                     # a constant (standardised) feature
    y = 10.0 + rng.standard_normal(30)
    theta = ridge_fit(with_bias(Z), y, lam=1e9)       # huge penalty: weights -> 0, bias free
    assert np.allclose(theta[:-1], 0, atol=1e-6)
    assert theta[-1] == pytest.approx(y.mean(), rel=1e-6)
    assert ridge_fit(with_bias(Z), y, lam=1.0)[2] == 0.0
    assert list(penalty_diag(3)) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError):
        ridge_fit(with_bias(Z), y, lam=0.0)


def test_pending_downdates_are_transparent():
    U, y, Uf, yf = problem(d=70, n_train=100, n_feedback=72, seed=2)   # 71 params: ragged blocks
    lazy = AnchoredRLS.from_training(U, y, 1.0)          # pending rank up to 32, then folded
    eager = AnchoredRLS.from_training(U, y, 1.0)
    eager.max_pending_rank = 0                            # fold on every sweep
    flushed = AnchoredRLS.from_training(U, y, 1.0)
    for start in range(0, 72, 8):
        for rls in (lazy, eager, flushed):
            rls.update(Uf[start:start + 8], yf[start:start + 8])
        _ = flushed.P                                     # materialise (flushes) in between
    for rls in (eager, flushed):
        assert rel(lazy.theta, rls.theta) < 1e-12
        assert rel(lazy.P, rls.P) < 1e-12
    assert lazy.nbytes >= 71 * 71 * 8


def test_rls_rejects_bad_input():
    rls = AnchoredRLS(np.zeros(3), np.eye(3))
    with pytest.raises(ValueError):
        rls.update(np.ones((2, 4)), np.ones(2))
    with pytest.raises(ValueError):
        rls.update(np.ones((2, 3)), np.ones(3))
    with pytest.raises(ValueError):
        rls.update(np.array([[np.nan, 1, 1]]), np.ones(1))
    with pytest.raises(ValueError):
        AnchoredRLS(np.zeros(3), np.eye(4))
    rls.update(np.empty((0, 3)), np.empty(0))         # an empty batch is a no-op
    assert rls.updates == 0
    # one update by hand: P = I, theta = 0, u = (1, 0, 1), y = 2
    rls.update(np.array([[1.0, 0.0, 1.0]]), np.array([2.0]))
    assert np.allclose(rls.theta, [2 / 3, 0, 2 / 3])
    assert np.allclose(rls.P, np.eye(3) - np.outer([1, 0, 1], [1, 0, 1]) / 3)
