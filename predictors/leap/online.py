"""``leap-rls``: LEAP with anchored RLS, corrected online by the true lengths of finished requests.

In the simulator, ``feedback`` buffers finished requests; once at least ``update_every`` (default 8)
are buffered, all buffered rows form one batch (exactly 8 when the engine reports them one by one
or in small groups), and ``feedback`` does the RLS math eagerly and returns a :class:`PendingUpdate` carrying a snapshot of the resulting
weights; ``publish`` makes that snapshot the one ``predict`` uses (a stale, older snapshot never
replaces a newer one). ``predict`` multiplies the precomputed standardised feature rows of the bound
workload by the published weights.
"""

from __future__ import annotations

import os
from functools import partial

import numpy as np

from core.readout import get_target, with_bias
from core.trace import Trace
from predictors.base import PendingUpdate, Predictor, PredictorOptions
from predictors.leap import online_rule
from predictors.leap.cost import rls_update_cpu_s
from predictors.leap.frozen import Leap
from predictors.leap.rls import AnchoredRLS


class LeapRLS(Leap):
    """LEAP with anchored RLS: feedback from finished requests corrects the weights online."""

    name = "leap-rls"
    learns_online = True   # feedback: anchored RLS updates

    def __init__(self, train_trace: str | os.PathLike | Trace = "lmsys", *, alpha: float | None = None,
                 use_cache: bool = True, update_every: int = 8, refresh: bool | None = None):
        # no decode-time refresh: the online update re-scores from the prefill state, and the refresh
        # ablation (Table 2) is run with frozen 'leap'
        super().__init__(train_trace, alpha=alpha, use_cache=use_cache)
        if update_every < 1:
            raise ValueError(f"update batch must be >= 1, got {update_every}")
        self.update_every = int(update_every)
        self.feedback_batch = self.update_every   # feedback updates once per full batch
        self.rls: AnchoredRLS | None = None

    @classmethod
    def from_options(cls, options: PredictorOptions) -> LeapRLS:
        if options.train_trace is None:
            raise ValueError(f"predictor {cls.name!r} needs a training trace (--train-trace)")
        return cls(options.train_trace, update_every=options.update_every, **cls._kwargs(options))

    def bind(self, workload: Trace, rng: np.random.Generator) -> None:
        Predictor.bind(self, workload, rng)
        self._fit(want_gram=True)
        X = self._check_workload(workload)
        readout = self.readout
        self._Z = readout.standardize(X, dtype=np.float32)      # rows of the bound workload
        self._start_online()

    def bind_beside(self, bound: Predictor, workload: Trace, rng: np.random.Generator) -> None:
        """``bound``'s read-out and standardised rows (read-only: a fleet holds its hidden states
        once), weights of its own."""
        if not self._shares_with(bound):
            self.bind(workload, rng)
            return
        assert isinstance(bound, LeapRLS)
        Predictor.bind(self, workload, rng)
        self._train, self._readout, self._gram, self._Z = bound._train, bound._readout, bound._gram, bound._Z
        self._start_online()

    def _start_online(self) -> None:
        """A fresh anchor at the read-out's weights, nothing published or buffered yet."""
        readout = self.readout
        self.rls = AnchoredRLS.from_weights(readout.theta, self._gram)   # fresh anchor per run
        self._published = self.rls.theta   # the published weights, written in place (the kernel reads them)
        self._published_version = 0
        self._version = 0
        self._buffer_rows: list[np.ndarray] = []
        self._buffer_len: list[np.ndarray] = []
        self._buffered = 0
        self._target = get_target(readout.target)

    def predict(self, rows, known=None) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        rule = self.estimate_rule
        if rule is None:   # a log target: numpy's exp
            theta = self._published
            return self.readout.output(self._Z[rows].astype(np.float64) @ theta[:-1] + theta[-1])
        return online_rule.estimates(self._Z, rows, self._published, *rule)

    @property
    def estimate_rule(self) -> tuple[bool, float, float, float] | None:
        """(square, lo, hi, cap) of :func:`predictors.leap.online_rule.estimate_row` for this read-out's
        target, or None for a target the rule does not cover (log)."""
        readout = self.readout
        if readout.target not in ("sqrt", "length"):
            return None
        lo, hi = readout.bounds
        return readout.target == "sqrt", float(lo), float(hi), float(readout.cap)

    def online_estimates(self) -> tuple | None:
        """(standardised rows, published weights, rule settings) for the compiled kernel's prefill
        estimates (:mod:`simulator.kernel_online`), or None when the rule does not cover the target."""
        rule = self.estimate_rule
        return None if rule is None else (self._Z, self._published, *rule)

    def fixed_estimates(self) -> np.ndarray | None:
        return None   # each publish changes the weights

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
        rls = self.rls
        if rls is None:
            raise RuntimeError(f"{self.name}: feedback before bind")
        rls.update(with_bias(self._Z[batch_rows]), self._target.forward(batch_len))
        self._version += 1
        publish = partial(self._publish, self._version, rls.theta)   # this update's snapshot
        return PendingUpdate(cpu_s=rls_update_cpu_s(batch_rows.size, rls.dim), publish=publish,
                             requests=int(batch_rows.size))

    def _publish(self, version: int, theta: np.ndarray) -> None:
        if version > self._published_version:       # an older snapshot never replaces a newer one
            self._published[:] = theta
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
