"""LEAP: a linear read-out of the serving model's hidden state, optionally corrected online by RLS.

Read-out (predictor ``leap``)
-----------------------------
- Feature: ``feat_last`` (the tapped layer's hidden state at the last prompt token), d dimensions.
- Standardise each dimension with the TRAINING trace's mean and population standard deviation; a
  dimension whose standard deviation is 0 (constant in training) keeps scale 1, so it standardises
  to exactly 0 on the training data and gets weight 0 from the ridge penalty.
- Design matrix ``U = [Z, 1]``: standardised features with the bias column LAST (the same layout the
  RLS state uses).
- Ridge regression on ``sqrt(output_tokens)``: minimise ``|U theta - y|^2 + lambda theta^T D theta``
  with ``D = diag(1, ..., 1, 0)``: every weight is penalised, the bias is not. With a column of ones,
  ``U^T U + lambda D`` is positive definite for any lambda > 0, even with constant features or d > n.
- Predict: clip the linear output to ``[1, sqrt(M)]`` (M = output cap of the training trace), square.

Choice of lambda (documented in ``describe()``): ``lambda = alpha * n_train``, with alpha picked by
5-fold cross-validation on the training trace only (folds from a fixed permutation, seed 0) over the
log grid ``alpha in 10^{-5, -4.5, ..., 1}`` (13 values), scoring the mean squared error of the
CLIPPED prediction in target space (sqrt tokens for the default target). Ties go to the larger
alpha. Each fold solves the problem with the bias left out by centring on the fold's training part
and one eigendecomposition of its centred Gram matrix, so the whole grid costs one ``eigh`` per fold.
The standardisation statistics come from the whole training trace (they use no labels).

Fitted read-outs are cached under ``cache_dir()/leap/`` as a small ``.npz`` (mean, scale, weights,
chosen alpha, CV curve) keyed by the training trace's content hash, the feature column, the target
and the fit settings; the penalised Gram matrix ``U^T U + lambda D`` that RLS needs goes to a
separate ``.gram.npz``. Writes are atomic; an unreadable cache file is refitted.

Online correction (predictor ``leap-rls``)
------------------------------------------
:class:`AnchoredRLS` starts from the ridge weights and ``P0 = (U^T U + lambda D)^-1`` over the
standardised training features, so after any sequence of feedback batches its weights equal the
one-shot ridge solution over training data plus all feedback (tests check 1e-8 relative error).
Each batch (b rows): ``V = P U^T``, ``S = I + U V``, ``theta += V S^-1 (y - U theta)``,
``P -= V S^-1 V^T``. The last step is written ``P -= H H^T`` with ``H = V L^-T`` (``S = L L^T``),
which is symmetric by construction. State is float64.

Memory traffic dominates at large d (P is 134 MB at d = 4096), so P is kept as its LOWER triangle
(plus full diagonal blocks; the strict upper triangle of the array is never read) and downdates are
applied lazily: ``H`` factors accumulate (true P = stored P - H H^T) and enter the next ``V`` as
``- H (H^T U^T)``, so most updates only READ half of P once. When the pending rank would exceed 32
(every 4th update of 8), the downdate is applied in place within the same blocked sweep that
computes V: each block of 32 rows is downdated and immediately multiplied while in cache. This is
the in-place rank-b update done blockwise (numpy has no in-place GEMM), with half the FLOPs.
``AnchoredRLS.P`` materialises the full symmetric matrix (a copy) with any pending downdate applied.

In the simulator, ``feedback`` buffers finished requests; once at least ``update_every`` (default 8)
are buffered, all buffered rows form one batch (exactly 8 when the engine reports them one by one
or in small groups), and ``feedback`` does the RLS math eagerly and returns a :class:`PendingUpdate` carrying a snapshot of the resulting
weights; ``publish`` makes that snapshot the one ``predict`` uses (a stale, older snapshot never
replaces a newer one). ``predict`` multiplies the precomputed standardised feature rows of the bound
workload by the published weights.

Cost figures (deterministic model constants, measured by ``benchmarks/bench_leap.py`` on the
development machine: 2-core shared AMD EPYC VM, numpy 2.4 with OpenBLAS 0.3.31, one thread):
see :func:`prediction_cpu_s` (3.0 us at d = 576, 8.4 us at d = 4096) and :func:`rls_update_cpu_s`
(0.5 ms per update of 8 at d = 576, 16 ms at d = 4096).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from predictors.base import PendingUpdate, Predictor, PredictorCost, PredictorOptions
from simulator.io import atomic_write_bytes, cache_dir
from simulator.trace import Trace, TraceError, load_trace, trace_from_arrays

DEFAULT_COLUMN = "feat_last"
DEFAULT_TARGET = "sqrt"
CV_FOLDS = 5
CV_SEED = 0
ALPHA_GRID: tuple[float, ...] = tuple(float(a) for a in np.logspace(-5, 1, 13))
FALLBACK_ALPHA = 1e-2          # used when the training trace is too small to cross-validate
CACHE_VERSION = 1

# --- cost model (benchmarks/bench_leap.py, one BLAS thread, on the development machine: a shared
# 2-vCPU AMD EPYC VM, numpy 2.4.6 with OpenBLAS 0.3.31, measured under a load average of 5-7, so the
# figures are thread CPU time, not wall time) ------------------------------------------------------
#: CPU seconds from the fp16 feature vector landing in host memory to a ready estimate
#: (``LinearReadout.predict_one``: fp16 -> fp32, folded dot product, clip, square), modelled as
#: PREDICT_FIXED_S + PREDICT_S_PER_DIM * d from the median single-request latencies: 8.4 us at
#: d = 4096, 3.0 us at d = 576. (With an fp32 feature it is 2.1 us at d = 4096.)
PREDICT_FIXED_S = 2.1e-6
PREDICT_S_PER_DIM = 1.55e-9
#: RLS update time model t(b, p) = RLS_FIXED_S + RLS_S_PER_BD2 * b * p^2 (p = d + 1 counts the bias),
#: from the mean CPU time per update of 8 over whole read-only/fold cycles: 16 ms at p = 4097
#: (read-only updates ~11 ms, every 4th folds the pending rank-32 downdate, ~30 ms); 0.5 ms at p = 577.
RLS_FIXED_S = 2e-4
RLS_S_PER_BD2 = 1.18e-10


def prediction_cpu_s(dim: int) -> float:
    """Modelled CPU seconds of one prediction from a ``dim``-wide feature vector."""
    return PREDICT_FIXED_S + PREDICT_S_PER_DIM * dim


def rls_update_cpu_s(batch: int, dim: int) -> float:
    """Modelled CPU seconds of one RLS update of ``batch`` rows with ``dim`` parameters."""
    return RLS_FIXED_S + RLS_S_PER_BD2 * batch * dim * dim


# ----------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Target:
    """A regression target: forward transform of lengths and the clip range of the linear output."""

    name: str

    def forward(self, length) -> np.ndarray:
        length = np.asarray(length, dtype=np.float64)
        if self.name == "sqrt":
            return np.sqrt(length)
        if self.name == "log":
            return np.log(length)
        return length

    def bounds(self, cap: float) -> tuple[float, float]:
        """Clip range of the linear output: the image of [1 token, M tokens]."""
        cap = float(max(cap, 1))
        if self.name == "sqrt":
            return 1.0, math.sqrt(cap)
        if self.name == "log":
            return 0.0, math.log(cap)
        return 1.0, cap

    def inverse(self, value) -> np.ndarray:
        value = np.asarray(value, dtype=np.float64)
        if self.name == "sqrt":
            return value * value
        if self.name == "log":
            return np.exp(value)
        return value.copy()


TARGETS = {name: Target(name) for name in ("length", "sqrt", "log")}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r} (choose from {', '.join(TARGETS)})") from None


# ----------------------------------------------------------------------------- linear algebra
def standardization_stats(X) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and scale (population std; 1 where the std is 0 or not finite)."""
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"features must be a non-empty (n, d) matrix, got shape {X.shape}")
    mean = X.mean(axis=0, dtype=np.float64)
    var = np.zeros(X.shape[1])
    for start in range(0, X.shape[0], 4096):          # chunked: no n x d float64 temporary
        block = X[start:start + 4096].astype(np.float64) - mean
        var += np.einsum("ij,ij->j", block, block)
    std = np.sqrt(var / X.shape[0])
    scale = np.where((std > 0) & np.isfinite(std), std, 1.0)
    return mean, scale


def standardize(X, mean: np.ndarray, scale: np.ndarray, dtype=np.float64) -> np.ndarray:
    """``(X - mean) / scale`` computed in float64, returned as ``dtype``."""
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != mean.shape[0]:
        raise ValueError(f"features have shape {X.shape}, expected (n, {mean.shape[0]})")
    out = np.empty(X.shape, dtype=dtype)
    for start in range(0, X.shape[0], 4096):
        out[start:start + 4096] = (X[start:start + 4096].astype(np.float64) - mean) / scale
    return out


def with_bias(Z) -> np.ndarray:
    """``[Z, 1]`` as float64: the design matrix with the bias column last."""
    Z = np.asarray(Z, dtype=np.float64)
    if Z.ndim == 1:
        Z = Z[None, :]
    U = np.empty((Z.shape[0], Z.shape[1] + 1))
    U[:, :-1] = Z
    U[:, -1] = 1.0
    return U


def penalty_diag(dim: int) -> np.ndarray:
    """Diagonal of D for ``dim`` parameters (bias last): ones, and 0 for the unpenalised bias."""
    D = np.ones(dim)
    D[-1] = 0.0
    return D


def ridge_system(U, y, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """``(A, r)`` with ``A = U^T U + lam D`` and ``r = U^T y`` (bias column last in U)."""
    U = np.asarray(U, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).ravel()
    if lam <= 0 or not np.isfinite(lam):
        raise ValueError(f"ridge lambda must be finite and > 0, got {lam}")
    A = U.T @ U
    A[np.diag_indices_from(A)] += lam * penalty_diag(U.shape[1])
    return A, U.T @ y


def ridge_fit(U, y, lam: float) -> np.ndarray:
    """Closed-form ridge weights with an unpenalised bias (bias column last in U)."""
    A, r = ridge_system(U, y, lam)
    return np.linalg.solve(A, r)


def _sym_inverse(A: np.ndarray) -> np.ndarray:
    P = np.linalg.solve(A, np.eye(A.shape[0]))
    P += P.T
    P *= 0.5
    return P


# ----------------------------------------------------------------------------- anchored RLS
class AnchoredRLS:
    """Recursive least squares anchored at a ridge solution (float64, bias column last).

    ``theta``: (p,) weights; ``P``: (p, p) symmetric positive definite, the inverse of the
    penalised Gram matrix. :meth:`update` folds in a batch ``(U, y)`` so that afterwards
    ``theta = (P_0^-1 + sum U^T U)^-1 (P_0^-1 theta_0 + sum U^T y)``, i.e. the one-shot ridge
    solution over the anchor's data plus every batch seen.
    """

    block_rows = 32          # rows of P per block of the sweep (32 x 4097 doubles = 1 MiB)
    max_pending_rank = 32    # low-rank downdates kept pending before they are folded into P

    def __init__(self, theta, P):
        theta = np.array(theta, dtype=np.float64).ravel()
        P = np.array(P, dtype=np.float64, order="C")
        p = theta.shape[0]
        if P.shape != (p, p):
            raise ValueError(f"P has shape {P.shape}, expected ({p}, {p}) to match theta")
        if not (np.isfinite(theta).all() and np.isfinite(P).all()):
            raise ValueError("theta and P must be finite")
        P += P.T
        P *= 0.5
        self._theta = theta
        self._P = P                 # lower triangle and diagonal blocks are authoritative
        self._H: np.ndarray | None = None  # pending downdates: true P = stored P - H H^T
        self.updates = 0
        self.rows_seen = 0

    @classmethod
    def from_training(cls, U, y, lam: float) -> "AnchoredRLS":
        """Anchor at ridge over training rows: theta = A^-1 U^T y, P = A^-1, A = U^T U + lam D."""
        A, r = ridge_system(U, y, lam)
        return cls.from_system(A, r)

    @classmethod
    def from_system(cls, A, r) -> "AnchoredRLS":
        """Anchor from the penalised Gram matrix ``A`` and right-hand side ``r`` (theta = A^-1 r)."""
        A = np.asarray(A, dtype=np.float64)
        return cls(np.linalg.solve(A, np.asarray(r, dtype=np.float64)), _sym_inverse(A))

    @classmethod
    def from_weights(cls, theta, A) -> "AnchoredRLS":
        """Anchor at given weights with ``P = A^-1``."""
        return cls(theta, _sym_inverse(np.asarray(A, dtype=np.float64)))

    @property
    def dim(self) -> int:
        return self._theta.shape[0]

    @property
    def theta(self) -> np.ndarray:
        """A copy of the current weights (bias last)."""
        return self._theta.copy()

    @property
    def P(self) -> np.ndarray:
        """A full symmetric copy of the current P (applies any pending downdate first)."""
        self.flush()
        lower = np.tril(self._P)
        return lower + np.tril(lower, -1).T

    @property
    def nbytes(self) -> int:
        """Bytes of RLS state held (P array, weights, pending downdate)."""
        pending = self._H.nbytes if self._H is not None else 0
        return int(self._P.nbytes + self._theta.nbytes + pending)

    def _blocks(self):
        p = self.dim
        for start in range(0, p, self.block_rows):
            yield start, min(start + self.block_rows, p)

    def _downdate_rows(self, start: int, end: int, Ht: np.ndarray) -> np.ndarray:
        """Apply the pending ``P -= H H^T`` to the lower part of rows [start, end); return them."""
        rows = self._P[start:end, :end]
        rows -= self._H[start:end] @ Ht[:, :end]
        diag = self._P[start:end, start:end]
        diag[...] = 0.5 * (diag + diag.T)
        return rows

    def flush(self) -> None:
        """Apply a pending downdate now (``update`` otherwise fuses it with the next sweep)."""
        if self._H is None:
            return
        Ht = np.ascontiguousarray(self._H.T)
        for start, end in self._blocks():
            self._downdate_rows(start, end, Ht)
        self._H = None

    def _sweep(self, U: np.ndarray) -> np.ndarray:
        """``V = P U^T`` from the lower triangle of the stored P and the pending downdate.

        While the pending rank stays within :attr:`max_pending_rank`, P is only read and the
        pending term enters as ``- H (H^T U^T)``; otherwise the pending downdate is applied in the
        same blocked pass that computes V.
        """
        Ut = np.ascontiguousarray(U.T)
        V = np.zeros((self.dim, U.shape[0]))
        H = self._H
        fold = H is not None and H.shape[1] + U.shape[0] > self.max_pending_rank
        Ht = np.ascontiguousarray(H.T) if fold else None
        for start, end in self._blocks():
            if fold:
                rows = self._downdate_rows(start, end, Ht)
            else:
                rows = self._P[start:end, :end]
            V[start:end] += rows @ Ut[:end]
            if start:
                V[:start] += rows[:, :start].T @ Ut[start:end]
        if fold:
            self._H = None
        elif H is not None:
            V -= H @ (H.T @ Ut)
        return V

    def update(self, U, y) -> None:
        """Fold in a batch: ``U`` (b, p) standardised features with bias column last, ``y`` (b,)."""
        U = np.ascontiguousarray(np.atleast_2d(np.asarray(U, dtype=np.float64)))
        y = np.asarray(y, dtype=np.float64).ravel()
        if U.shape[1] != self.dim or U.shape[0] != y.shape[0]:
            raise ValueError(f"batch shapes U {U.shape}, y {y.shape} do not match dim {self.dim}")
        if U.shape[0] == 0:
            return
        if not (np.isfinite(U).all() and np.isfinite(y).all()):
            raise ValueError("RLS batch must be finite")
        V = self._sweep(U)                               # P U^T, one pass over P
        S = U @ V
        S += S.T
        S *= 0.5
        S[np.diag_indices_from(S)] += 1.0
        L = np.linalg.cholesky(S)
        self._theta += V @ np.linalg.solve(S, y - U @ self._theta)
        H = np.linalg.solve(L, V.T).T                    # V L^-T: H H^T = V S^-1 V^T
        self._H = np.ascontiguousarray(H if self._H is None else np.hstack([self._H, H]))
        self.updates += 1
        self.rows_seen += U.shape[0]


# ----------------------------------------------------------------------------- cross-validation
def select_alpha(Z: np.ndarray, t: np.ndarray, bounds: tuple[float, float], *,
                 grid=ALPHA_GRID, folds: int = CV_FOLDS, seed: int = CV_SEED
                 ) -> tuple[float, np.ndarray | None]:
    """Pick alpha (lambda = alpha * n_train) by K-fold MSE of the clipped prediction.

    ``Z``: standardised training features (n, d); ``t``: targets. Returns (alpha, mse per alpha),
    or (FALLBACK_ALPHA, None) when there are fewer than 2 * folds rows.
    """
    n, d = Z.shape
    grid = np.asarray(grid, dtype=np.float64)
    if n < 2 * folds:
        return FALLBACK_ALPHA, None
    lo, hi = bounds
    perm = np.random.default_rng(seed).permutation(n)
    parts = np.array_split(perm, folds)
    stats = []
    for idx in parts:
        Zf = np.asarray(Z[idx], dtype=np.float64)
        tf = t[idx]
        stats.append((Zf, tf, Zf.T @ Zf, Zf.T @ tf, Zf.sum(axis=0), tf.sum()))
    G = sum(s[2] for s in stats)
    zy = sum(s[3] for s in stats)
    zs = sum(s[4] for s in stats)
    ys = float(sum(s[5] for s in stats))
    sse = np.zeros(grid.size)
    for Zf, tf, Gf, zyf, zsf, ysf in stats:
        nt = n - Zf.shape[0]
        mt = (zs - zsf) / nt
        yt = (ys - ysf) / nt
        C = (G - Gf) - nt * np.outer(mt, mt)          # centred Gram of the fold's training part
        c = (zy - zyf) - nt * mt * yt
        ev, Q = np.linalg.eigh(0.5 * (C + C.T))
        ev = np.maximum(ev, 0.0)
        W = Q @ ((Q.T @ c)[:, None] / (ev[:, None] + grid[None, :] * nt))   # d x L weights
        pred = Zf @ W + (yt - mt @ W)[None, :]
        np.clip(pred, lo, hi, out=pred)
        sse += ((pred - tf[:, None]) ** 2).sum(axis=0)
    mse = sse / n
    best = np.flatnonzero(mse <= mse.min() * (1 + 1e-12))
    return float(grid[best[-1]]), mse


# ----------------------------------------------------------------------------- the read-out
@dataclass
class LinearReadout:
    """A fitted read-out: standardisation, weights (bias last), target and clip range."""

    mean: np.ndarray
    scale: np.ndarray
    theta: np.ndarray
    target: str = DEFAULT_TARGET
    cap: int = 2048
    lam: float = 1.0
    alpha: float | None = None
    cv_mse: np.ndarray | None = None
    n_train: int = 0
    prior_length: float = 1.0
    column: str = DEFAULT_COLUMN
    layer: int | None = None
    train_name: str = ""
    train_hash: str = ""
    cache_path: str | None = None
    _raw: tuple = field(default=(), repr=False)

    def __post_init__(self) -> None:
        self.mean = np.asarray(self.mean, dtype=np.float64)
        self.scale = np.asarray(self.scale, dtype=np.float64)
        self.theta = np.asarray(self.theta, dtype=np.float64)
        if self.theta.shape != (self.mean.shape[0] + 1,):
            raise ValueError("theta must have d + 1 entries (bias last)")
        lo, hi = self.bounds
        # serving fast path: standardisation folded into raw-space weights
        w = self.theta[:-1] / self.scale
        self._raw = (w.astype(np.float32), float(self.theta[-1] - self.mean @ w), lo, hi,
                     self.target == "sqrt", float(self.cap))

    @property
    def d(self) -> int:
        return int(self.mean.shape[0])

    @property
    def bounds(self) -> tuple[float, float]:
        return get_target(self.target).bounds(self.cap)

    def standardize(self, X, dtype=np.float64) -> np.ndarray:
        return standardize(X, self.mean, self.scale, dtype)

    def linear(self, Z, theta=None) -> np.ndarray:
        """Linear output for STANDARDISED rows ``Z`` (n, d) with weights ``theta`` (bias last)."""
        theta = self.theta if theta is None else theta
        Z = np.asarray(Z)
        out = np.empty(Z.shape[0])
        for start in range(0, Z.shape[0], 4096):       # chunked float64 upcast of float32 rows
            out[start:start + 4096] = Z[start:start + 4096].astype(np.float64) @ theta[:-1]
        return out + theta[-1]

    def output(self, linear) -> np.ndarray:
        """Clip the linear output to the target's range and map it back to tokens."""
        lo, hi = self.bounds
        out = get_target(self.target).inverse(np.clip(linear, lo, hi))
        return np.clip(out, 1.0, float(self.cap), out=out)    # exact [1, M] despite rounding

    def predict(self, X) -> np.ndarray:
        """Lengths in tokens for raw feature rows ``X`` (n, d)."""
        return self.output(self.linear(self.standardize(X)))

    def predict_workload(self, X) -> np.ndarray:
        """Lengths for a workload's raw rows exactly as :meth:`Leap.bind` computes them (float32
        standardisation, float64 dot); ``capture-traces signal`` reports these too."""
        return self.output(self.linear(self.standardize(X, dtype=np.float32)))

    def predict_batch(self, X) -> np.ndarray:
        """Lengths for raw rows ``X`` via the folded float32 weights (the serving fast path, batched)."""
        w, b, lo, hi, square, cap = self._raw
        lin = np.asarray(X, dtype=np.float32) @ w
        value = np.clip(lin.astype(np.float64) + b, lo, hi)
        value = value * value if square else get_target(self.target).inverse(value)
        return np.clip(value, 1.0, cap, out=value)

    def predict_one(self, x) -> float:
        """One request's length from its raw feature vector (the serving fast path, float32 dot)."""
        w, b, lo, hi, square, cap = self._raw
        value = float(np.dot(x, w)) + b
        value = lo if value < lo else hi if value > hi else value
        value = value * value if square else float(get_target(self.target).inverse(value))
        return min(max(value, 1.0), cap)

    def describe(self) -> dict:
        return {
            "feature_column": self.column,
            "layer": self.layer,
            "d": self.d,
            "target": self.target,
            "clip": [float(v) for v in self.bounds],
            "output_cap": int(self.cap),
            "lambda": float(self.lam),
            "alpha": None if self.alpha is None else float(self.alpha),
            "lambda_selection": (f"lambda = alpha * n_train, alpha by {CV_FOLDS}-fold CV (seed {CV_SEED}) "
                                 "on the training trace over 10^-5..10^1 (13 log steps), minimising MSE "
                                 "of the clipped prediction in target space; D = I with bias unpenalised"
                                 if self.cv_mse is not None else "fixed"),
            "cv_mse": None if self.cv_mse is None else [float(v) for v in self.cv_mse],
            "n_train": int(self.n_train),
            "prior_length": float(self.prior_length),
            "train_trace": self.train_name,
            "train_hash": self.train_hash,
        }


def _cache_key(train: Trace, column: str, target: str, alpha: float | None, grid, folds, seed) -> str:
    material = json.dumps({"v": CACHE_VERSION, "trace": train.content_hash, "column": column,
                           "target": target, "alpha": alpha, "grid": [float(g) for g in grid],
                           "folds": folds, "seed": seed}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:24]


def _cache_paths(train: Trace, column: str, target: str, key: str) -> tuple[Path, Path]:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", train.name)[:40] or "trace"
    base = cache_dir() / "leap" / f"{safe}-{column}-{target}-{key}"
    return base.with_suffix(".npz"), Path(str(base) + ".gram.npz")


def _npz_bytes(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _features(trace: Trace, columns: tuple[str, ...]) -> np.ndarray:
    if len(columns) == 1:
        return trace.feature(columns[0])
    return np.hstack([trace.feature(c) for c in columns])


def _train_layer(train: Trace, column: str) -> int | None:
    layer = train.feature_layer(column)
    return int(layer) if isinstance(layer, (int, np.integer)) else None


def _load_cached(path: Path, train: Trace, column: str) -> LinearReadout | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            info = json.loads(str(data["info"]))
            cv = data["cv_mse"] if data["cv_mse"].size else None
            return LinearReadout(mean=data["mean"], scale=data["scale"], theta=data["theta"],
                                 cv_mse=cv, cache_path=str(path), **info)
    except (OSError, KeyError, ValueError, TypeError):
        return None


def fit_readout(train: Trace, column: str | tuple[str, ...] = DEFAULT_COLUMN, target: str = DEFAULT_TARGET, *,
                alpha: float | None = None, grid=ALPHA_GRID, folds: int = CV_FOLDS,
                seed: int = CV_SEED, use_cache: bool = True, want_gram: bool = False
                ) -> tuple[LinearReadout, np.ndarray | None]:
    """Fit (or load from the cache) a read-out on ``train``'s ``column`` (a tuple: concatenated).

    Returns ``(readout, A)`` where ``A = U^T U + lambda D`` over the standardised training rows
    (bias last) when ``want_gram`` (the RLS anchor needs it), else ``(readout, None)``.
    """
    tgt = get_target(target)
    columns = (column,) if isinstance(column, str) else tuple(column)
    for col in columns:
        if not train.has_feature(col):
            raise TraceError(f"trace {train.name}: has no feature column {col!r} to train LEAP on")
    column = "+".join(columns)
    key = _cache_key(train, column, target, alpha, grid, folds, seed)
    path, gram_path = _cache_paths(train, column, target, key) if use_cache else (None, None)
    if use_cache and path.is_file():
        readout = _load_cached(path, train, column)
        if readout is not None:
            if not want_gram:
                return readout, None
            try:
                with np.load(gram_path, allow_pickle=False) as data:
                    A = np.array(data["A"], dtype=np.float64)
                if A.shape == (readout.d + 1, readout.d + 1):
                    return readout, A
            except (OSError, KeyError, ValueError):
                pass
            Z = readout.standardize(_features(train, columns))
            A, _ = ridge_system(with_bias(Z), tgt.forward(train.output_tokens), readout.lam)
            atomic_write_bytes(gram_path, _npz_bytes(A=A))
            return readout, A

    X = _features(train, columns)
    lengths = train.output_tokens.astype(np.float64)
    cap = int(train.output_cap)
    mean, scale = standardization_stats(X)
    Z = standardize(X, mean, scale)
    t = tgt.forward(lengths)
    n = Z.shape[0]
    cv_mse = None
    if alpha is None:
        alpha, cv_mse = select_alpha(Z, t, tgt.bounds(cap), grid=grid, folds=folds, seed=seed)
    lam = float(alpha) * n
    A = np.empty((Z.shape[1] + 1, Z.shape[1] + 1))
    A[:-1, :-1] = Z.T @ Z
    A[:-1, -1] = A[-1, :-1] = Z.sum(axis=0)
    A[-1, -1] = n
    A[np.diag_indices_from(A)] += lam * penalty_diag(A.shape[0])
    r = np.empty(Z.shape[1] + 1)
    r[:-1] = Z.T @ t
    r[-1] = t.sum()
    theta = np.linalg.solve(A, r)
    readout = LinearReadout(mean=mean, scale=scale, theta=theta, target=target, cap=cap, lam=lam,
                            alpha=float(alpha), cv_mse=cv_mse, n_train=n,
                            prior_length=float(lengths.mean()), column=column,
                            layer=_train_layer(train, column), train_name=train.name,
                            train_hash=train.content_hash)
    if use_cache:
        info = {"target": target, "cap": cap, "lam": lam, "alpha": float(alpha), "n_train": n,
                "prior_length": readout.prior_length, "column": column, "layer": readout.layer,
                "train_name": train.name, "train_hash": train.content_hash}
        atomic_write_bytes(path, _npz_bytes(mean=mean, scale=scale, theta=theta,
                                            cv_mse=cv_mse if cv_mse is not None else np.empty(0),
                                            info=np.array(json.dumps(info))))
        atomic_write_bytes(gram_path, _npz_bytes(A=A))
        readout.cache_path = str(path)
    return readout, (A if want_gram else None)


# Decode-time refresh (the paper's Table 2 ablation). Re-reading the tapped layer during decode
# means copying one request's state to the CPU at a step boundary, which breaks the asynchronous
# pipeline: charged as a small GPU stall per refreshed request (an estimate: ~10 us for the D2H
# copy of one 8 KB vector plus ~10 us of synchronisation; no GPU was available to measure it).
REFRESH_GPU_S = 20e-6


def fit_decode_readout(train: Trace, layer: int, *, use_cache: bool = True) -> LinearReadout:
    """Ridge read-out of sqrt(remaining tokens) from decode-time states of ``layer`` in ``train``'s
    decode side table: the refresh model, trained like the prefill one (same CV, clip, square)."""
    rows, generated, vectors = train.decode_vectors(layer)
    remaining = train.output_tokens[rows] - generated
    keep = remaining >= 1
    if keep.sum() < 10:
        raise TraceError(f"trace {train.name}: too few decode states at layer {layer} to train a refresh "
                         f"read-out ({int(keep.sum())})")
    samples = trace_from_arrays(f"{train.name}-decode-L{layer}", np.ones(int(keep.sum()), dtype=np.int32),
                                remaining[keep], max_tokens=train.output_cap,
                                features={DEFAULT_COLUMN: vectors[keep]},
                                metadata={"layers": {DEFAULT_COLUMN: int(layer)}})
    readout, _ = fit_readout(samples, DEFAULT_COLUMN, DEFAULT_TARGET, use_cache=use_cache)
    return readout


# ----------------------------------------------------------------------------- predictors
def _tap_fraction(metadata: dict, column: str) -> float:
    layer = (metadata.get("layers") or {}).get(column)
    num_layers = metadata.get("num_layers")
    if (isinstance(layer, (int, np.integer)) and isinstance(num_layers, (int, np.integer))
            and not isinstance(layer, bool) and 0 <= layer < num_layers):
        return (int(layer) + 1) / int(num_layers)
    return 1.0


class Leap(Predictor):
    """Frozen LEAP read-out (ridge on sqrt length), scored on the CPU once prefill taps the layer.

    ``PredictorOptions.extra`` keys: ``leap_alpha`` (skip cross-validation, lambda = alpha * n_train),
    ``leap_cache`` (False: neither read nor write the fit cache).
    """

    name = "leap"
    stage = "prefill"
    requires = (DEFAULT_COLUMN,)
    column = DEFAULT_COLUMN
    target = DEFAULT_TARGET

    def __init__(self, train_trace: str | os.PathLike | Trace = "lmsys", *, alpha: float | None = None,
                 use_cache: bool = True, refresh: bool | None = None):
        if train_trace is None:
            raise ValueError(f"predictor {self.name!r} needs a training trace (--train-trace)")
        self.use_refresh = bool(refresh)
        self._train_spec = train_trace
        self._alpha = alpha
        self._use_cache = use_cache
        self._train: Trace | None = None
        self._readout: LinearReadout | None = None
        self._gram: np.ndarray | None = None

    @classmethod
    def _kwargs(cls, options: PredictorOptions) -> dict:
        extra = options.extra or {}
        alpha = extra.get("leap_alpha")
        return {"alpha": None if alpha is None else float(alpha),
                "use_cache": bool(extra.get("leap_cache", True)), "refresh": options.refresh}

    @classmethod
    def from_options(cls, options: PredictorOptions) -> "Leap":
        if options.train_trace is None:
            raise ValueError(f"predictor {cls.name!r} needs a training trace (--train-trace)")
        return cls(options.train_trace, **cls._kwargs(options))

    # -- training ---------------------------------------------------------------------------
    @property
    def train_trace(self) -> Trace:
        if self._train is None:
            spec = self._train_spec
            self._train = spec if isinstance(spec, Trace) else load_trace(spec)
        return self._train

    def _fit(self, want_gram: bool) -> None:
        if self._readout is None or (want_gram and self._gram is None):
            self._readout, gram = fit_readout(self.train_trace, self.column, self.target,
                                              alpha=self._alpha, use_cache=self._use_cache,
                                              want_gram=want_gram)
            if gram is not None:
                self._gram = gram

    @property
    def readout(self) -> LinearReadout:
        self._fit(want_gram=False)
        return self._readout

    # -- binding ------------------------------------------------------------------------------
    def _check_workload(self, workload: Trace) -> np.ndarray:
        readout = self.readout
        X = workload.feature(self.column)
        if X.shape[1] != readout.d:
            raise TraceError(f"trace {workload.name}: column {self.column} has {X.shape[1]} dimensions, "
                             f"but LEAP was trained on {readout.d} (training trace {readout.train_name})")
        layer = workload.feature_layer(self.column)
        if readout.layer is not None and isinstance(layer, int) and layer != readout.layer:
            raise TraceError(f"trace {workload.name}: column {self.column} taps layer {layer}, but LEAP "
                             f"was trained on layer {readout.layer} (training trace {readout.train_name})")
        return X

    def bind(self, workload: Trace, rng: np.random.Generator) -> None:
        super().bind(workload, rng)
        X = self._check_workload(workload)
        readout = self.readout
        self._pred = readout.predict_workload(X)
        self.refresh_every = None
        if self.use_refresh:
            self._bind_refresh(workload)

    def _bind_refresh(self, workload: Trace) -> None:
        """Estimates from every recorded decode state of the workload, looked up at refresh time."""
        layer = self.readout.layer
        every = workload.metadata.get("decode_every_k")
        if layer is None or not every or workload.decode_path is None:
            raise TraceError(f"predictor {self.name!r} with refresh needs a decode side table at layer {layer} "
                             f"(decode_every_k in the metadata); trace {workload.name!r} has none")
        decoder = fit_decode_readout(self.train_trace, layer, use_cache=self._use_cache)
        rows, generated, vectors = workload.decode_vectors(layer)
        if len(rows) == 0:
            raise TraceError(f"trace {workload.name!r}: its decode side table has no states at layer {layer}")
        self._decoder = decoder
        self._dec_gen = generated
        self._dec_total = generated + decoder.output(decoder.linear(decoder.standardize(vectors, dtype=np.float32)))
        n = len(workload)
        self._dec_start = np.searchsorted(rows, np.arange(n), side="left")
        self._dec_end = np.searchsorted(rows, np.arange(n), side="right")
        self.refresh_every = int(every)

    def predict(self, rows) -> np.ndarray:
        return self._pred[np.asarray(rows, dtype=np.int64)]

    def refresh(self, rows, generated) -> np.ndarray:
        """Total length = tokens generated when the latest recorded state was taken + its estimate
        of the remaining tokens; rows without a newer state keep their current estimate."""
        rows = np.asarray(rows, dtype=np.int64)
        out = self._pred[rows].copy()
        for i, (row, g) in enumerate(zip(rows.tolist(), np.asarray(generated).tolist())):
            a, b = self._dec_start[row], self._dec_end[row]
            j = a + int(np.searchsorted(self._dec_gen[a:b], g, side="right")) - 1
            if j >= a:
                out[i] = max(self._dec_total[j], g + 1.0)
        self._pred[rows] = out
        return out

    # -- cost and description -----------------------------------------------------------------
    def cost(self) -> PredictorCost:
        meta = self.workload.metadata if hasattr(self, "workload") else self.train_trace.metadata
        return PredictorCost(cpu_s_per_prediction=prediction_cpu_s(self.readout.d),
                             tap_fraction=_tap_fraction(meta, self.column),
                             gpu_s_per_refresh=REFRESH_GPU_S if self.use_refresh else 0.0)

    @property
    def prior_length(self) -> float:
        return float(self.readout.prior_length)

    def describe(self) -> dict:
        out = {"name": self.name, **self.readout.describe()}
        out["cpu_s_per_prediction"] = prediction_cpu_s(self.readout.d)
        out["tap_fraction"] = self.cost().tap_fraction
        out["refresh"] = self.use_refresh
        if self.use_refresh and getattr(self, "_decoder", None) is not None:
            out["refresh_every"] = self.refresh_every
            out["refresh_readout"] = self._decoder.describe()
            out["refresh_gpu_s"] = REFRESH_GPU_S
        return out


class LeapRLS(Leap):
    """LEAP with anchored RLS: feedback from finished requests corrects the weights online."""

    name = "leap-rls"

    def __init__(self, train_trace: str | os.PathLike | Trace = "lmsys", *, alpha: float | None = None,
                 use_cache: bool = True, update_every: int = 8, refresh: bool | None = None):
        # no decode-time refresh: the online update re-scores from the prefill state, and the refresh
        # ablation (Table 2) is run with frozen 'leap'
        super().__init__(train_trace, alpha=alpha, use_cache=use_cache)
        if update_every < 1:
            raise ValueError(f"update batch must be >= 1, got {update_every}")
        self.update_every = int(update_every)
        self.rls: AnchoredRLS | None = None

    @classmethod
    def from_options(cls, options: PredictorOptions) -> "LeapRLS":
        if options.train_trace is None:
            raise ValueError(f"predictor {cls.name!r} needs a training trace (--train-trace)")
        return cls(options.train_trace, update_every=options.update_every, **cls._kwargs(options))

    def bind(self, workload: Trace, rng: np.random.Generator) -> None:
        Predictor.bind(self, workload, rng)
        self._fit(want_gram=True)
        X = self._check_workload(workload)
        readout = self._readout
        self._Z = readout.standardize(X, dtype=np.float32)      # rows of the bound workload
        self.rls = AnchoredRLS.from_weights(readout.theta, self._gram)   # fresh anchor per run
        self._published = self.rls.theta
        self._published_version = 0
        self._version = 0
        self._buffer_rows: list[np.ndarray] = []
        self._buffer_len: list[np.ndarray] = []
        self._buffered = 0
        self._target = get_target(readout.target)

    def predict(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        theta = self._published
        return self._readout.output(self._Z[rows].astype(np.float64) @ theta[:-1] + theta[-1])

    def feedback(self, rows, output_tokens) -> PendingUpdate | None:
        rows = np.asarray(rows, dtype=np.int64).ravel()
        lengths = np.asarray(output_tokens, dtype=np.float64).ravel()
        if rows.shape != lengths.shape:
            raise ValueError("feedback rows and output_tokens differ in length")
        if rows.size == 0:
            return None
        self._buffer_rows.append(rows)
        self._buffer_len.append(lengths)
        self._buffered += rows.size
        if self._buffered < self.update_every:
            return None
        batch_rows = np.concatenate(self._buffer_rows)
        batch_len = np.concatenate(self._buffer_len)
        self._buffer_rows, self._buffer_len, self._buffered = [], [], 0
        self.rls.update(with_bias(self._Z[batch_rows]), self._target.forward(batch_len))
        self._version += 1
        publish = partial(self._publish, self._version, self.rls.theta)   # this update's snapshot
        return PendingUpdate(cpu_s=rls_update_cpu_s(batch_rows.size, self.rls.dim), publish=publish,
                             requests=int(batch_rows.size))

    def _publish(self, version: int, theta: np.ndarray) -> None:
        if version > self._published_version:       # an older snapshot never replaces a newer one
            self._published = theta
            self._published_version = version

    @property
    def published_version(self) -> int:
        return self._published_version

    def describe(self) -> dict:
        out = super().describe()
        dim = (self.readout.d + 1)
        out.update({"update_every": self.update_every,
                    "rls_update_cpu_s": rls_update_cpu_s(self.update_every, dim),
                    "rls_state_bytes": dim * dim * 8,
                    "rls": "anchored RLS from the ridge weights, P0 = (U^T U + lambda D)^-1 over the "
                           "standardised training rows (bias last), float64"})
        return out
