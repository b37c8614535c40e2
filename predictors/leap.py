"""LEAP: a linear read-out of the serving model's hidden state, optionally corrected online by RLS.

Read-out (predictor ``leap``)
-----------------------------
The frozen ridge read-out of :mod:`core.readout` (standardise, ridge on ``sqrt(output_tokens)``
with lambda by 5-fold CV on the training trace, clip, square; cached under ``cache_dir()/leap/``),
scored on the CPU once prefill has tapped the layer.

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

import os
from functools import partial

import numpy as np

from core.readout import (DEFAULT_COLUMN, DEFAULT_TARGET, LinearReadout, fit_readout, get_target, ridge_system,
                          with_bias)
from core.trace import Trace, TraceError, load_trace, trace_from_arrays
from core.hardware import DEFAULT_HARDWARE, Hardware
from predictors.base import PendingUpdate, Predictor, PredictorCost, PredictorOptions

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

    Settings (``--setting leap.alpha=...``): ``alpha`` (skip cross-validation, lambda = alpha *
    n_train), ``cache`` (false: neither read nor write the fit cache).
    """

    name = "leap"
    stage = "prefill"
    requires = (DEFAULT_COLUMN,)
    column = DEFAULT_COLUMN
    target = DEFAULT_TARGET
    settings_defaults = {"alpha": None, "cache": True}

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
        settings = cls.settings(options)
        return {"alpha": settings["alpha"], "use_cache": settings["cache"], "refresh": options.refresh}

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

    def predict(self, rows, known=None) -> np.ndarray:
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
    def cost(self, hardware: Hardware = DEFAULT_HARDWARE) -> PredictorCost:
        """CPU-side costs (the read-out and RLS run on the host), the same on every GPU."""
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

    def predict(self, rows, known=None) -> np.ndarray:
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
