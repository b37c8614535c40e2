"""Anchored recursive least squares: LEAP+RLS's online correction.

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
"""

from __future__ import annotations

import numpy as np

from core.readout import ridge_system


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
    def from_training(cls, U, y, lam: float) -> AnchoredRLS:
        """Anchor at ridge over training rows: theta = A^-1 U^T y, P = A^-1, A = U^T U + lam D."""
        A, r = ridge_system(U, y, lam)
        return cls.from_system(A, r)

    @classmethod
    def from_system(cls, A, r) -> AnchoredRLS:
        """Anchor from the penalised Gram matrix ``A`` and right-hand side ``r`` (theta = A^-1 r)."""
        A = np.asarray(A, dtype=np.float64)
        return cls(np.linalg.solve(A, np.asarray(r, dtype=np.float64)), _sym_inverse(A))

    @classmethod
    def from_weights(cls, theta, A) -> AnchoredRLS:
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

    def _downdate_rows(self, start: int, end: int, H: np.ndarray, Ht: np.ndarray) -> np.ndarray:
        """Apply the pending ``P -= H H^T`` to the lower part of rows [start, end); return them."""
        rows = self._P[start:end, :end]
        rows -= H[start:end] @ Ht[:, :end]
        diag = self._P[start:end, start:end]
        diag[...] = 0.5 * (diag + diag.T)
        return rows

    def flush(self) -> None:
        """Apply a pending downdate now (``update`` otherwise fuses it with the next sweep)."""
        H = self._H
        if H is None:
            return
        Ht = np.ascontiguousarray(H.T)
        for start, end in self._blocks():
            self._downdate_rows(start, end, H, Ht)
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
        fold = H if H is not None and H.shape[1] + U.shape[0] > self.max_pending_rank else None
        Ht = None if fold is None else np.ascontiguousarray(fold.T)
        for start, end in self._blocks():
            if fold is not None and Ht is not None:
                rows = self._downdate_rows(start, end, fold, Ht)
            else:
                rows = self._P[start:end, :end]
            V[start:end] += rows @ Ut[:end]
            if start:
                V[:start] += rows[:, :start].T @ Ut[start:end]
        if fold is not None:
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
