"""The ridge read-out of output length from a hidden-state feature: the one fit that LEAP
(``predictors/leap.py``), ``capture-traces signal`` and the live scheduler all use, so their figures
agree.

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
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.io import atomic_write_bytes, cache_dir
from core.trace import Trace, TraceError

DEFAULT_COLUMN = "feat_last"
DEFAULT_TARGET = "sqrt"
CV_FOLDS = 5
CV_SEED = 0
ALPHA_GRID: tuple[float, ...] = tuple(float(a) for a in np.logspace(-5, 1, 13))
FALLBACK_ALPHA = 1e-2          # used when the training trace is too small to cross-validate
CACHE_VERSION = 1



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
    paths = _cache_paths(train, column, target, key) if use_cache else None
    if paths is not None and paths[0].is_file():
        path, gram_path = paths
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
    if paths is not None:
        path, gram_path = paths
        info = {"target": target, "cap": cap, "lam": lam, "alpha": float(alpha), "n_train": n,
                "prior_length": readout.prior_length, "column": column, "layer": readout.layer,
                "train_name": train.name, "train_hash": train.content_hash}
        atomic_write_bytes(path, _npz_bytes(mean=mean, scale=scale, theta=theta,
                                            cv_mse=cv_mse if cv_mse is not None else np.empty(0),
                                            info=np.array(json.dumps(info))))
        atomic_write_bytes(gram_path, _npz_bytes(A=A))
        readout.cache_path = str(path)
    return readout, (A if want_gram else None)


def out_of_fold_predictions(train: Trace, column: str = DEFAULT_COLUMN) -> np.ndarray:
    """Each training row predicted by the read-out fitted (lambda chosen by the same inner CV) on
    the other folds: the folds of the read-out's own CV (same count, same seeded permutation)."""
    n = len(train)
    pred = np.empty(n)
    X = train.feature(column)
    for part in np.array_split(np.random.default_rng(CV_SEED).permutation(n), CV_FOLDS):
        rest = np.setdiff1d(np.arange(n), part)
        readout, _ = fit_readout(train.take(rest), column, use_cache=False)
        pred[part] = readout.predict_workload(X[part])
    return pred
