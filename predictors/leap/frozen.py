"""``leap``: the frozen LEAP read-out, scored on the CPU once prefill has tapped the layer."""

from __future__ import annotations

import os

import numpy as np

from core.hardware import DEFAULT_HARDWARE, Hardware
from core.readout import DEFAULT_COLUMN, DEFAULT_TARGET, LinearReadout, fit_readout
from core.trace import Trace, TraceError, load_trace
from predictors.base import Predictor, PredictorCost, PredictorOptions
from predictors.leap.cost import REFRESH_GPU_S, prediction_cpu_s, tap_fraction
from predictors.leap.refresh import DecodeEstimates, fit_decode_readout


class Leap(Predictor):
    """Frozen LEAP read-out (ridge on sqrt length), scored on the CPU once prefill taps the layer.

    Settings (``--setting leap.alpha=...``): ``alpha`` (skip cross-validation, lambda = alpha *
    n_train), ``cache`` (false: neither read nor write the fit cache).
    """

    name = "leap"
    stage = "prefill"
    live = live_hook = True
    compiled, scores_at_arrival, serves_router = True, False, True
    why_not = {"scores_at_arrival": "it reads the serving model's hidden state, which exists only once prefill "
                                    "reaches the tapped layer"}
    learned = True
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
    def from_options(cls, options: PredictorOptions) -> Leap:
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
        if self._readout is None:
            raise RuntimeError(f"{self.name}: the read-out was not fitted")   # _fit sets it
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

    def _shares_with(self, bound: Predictor) -> bool:
        """Whether ``bound`` holds what this one would compute: same class, training and settings,
        no refresh (it rewrites its estimates)."""
        return (type(bound) is type(self) and isinstance(bound, Leap) and not self.use_refresh
                and not bound.use_refresh and bound._alpha == self._alpha and bound._use_cache == self._use_cache
                and (bound._train_spec is self._train_spec
                     or (isinstance(self._train_spec, str | os.PathLike) and bound._train_spec == self._train_spec)))

    def bind_beside(self, bound: Predictor, workload: Trace, rng: np.random.Generator) -> None:
        """The read-out and its estimates of ``bound`` (nothing in them changes once bound)."""
        if not self._shares_with(bound):
            self.bind(workload, rng)
            return
        assert isinstance(bound, Leap)
        Predictor.bind(self, workload, rng)
        self._train, self._readout, self._gram = bound._train, bound._readout, bound._gram
        self._pred = bound._pred
        self.refresh_every = None

    def _bind_refresh(self, workload: Trace) -> None:
        """Estimates from every recorded decode state of the workload, looked up at refresh time."""
        layer = self.readout.layer
        every = workload.metadata.get("decode_every_k")
        if layer is None or not every or workload.decode_path is None:
            raise TraceError(f"predictor {self.name!r} with refresh needs a decode side table at layer {layer} "
                             f"(decode_every_k in the metadata); trace {workload.name!r} has none")
        decoder = fit_decode_readout(self.train_trace, layer, use_cache=self._use_cache)
        self._decode = DecodeEstimates(decoder, workload, layer)
        self.refresh_every = int(every)

    def predict(self, rows, known=None) -> np.ndarray:
        return self._pred[np.asarray(rows, dtype=np.int64)]

    def fixed_estimates(self) -> np.ndarray | None:
        """The read-out of the whole trace, computed in ``bind`` (not with refresh: it rewrites them)."""
        return None if self.use_refresh else self._pred

    def refresh(self, rows, generated) -> np.ndarray:
        """Re-estimated totals from the latest recorded decode state (see :mod:`predictors.leap.refresh`)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = self._decode.refresh(self._pred[rows], rows, generated)
        self._pred[rows] = out
        return out

    # -- cost and description -----------------------------------------------------------------
    def cost(self, hardware: Hardware = DEFAULT_HARDWARE) -> PredictorCost:
        """CPU-side costs (the read-out and RLS run on the host), the same on every GPU."""
        meta = self.workload.metadata if hasattr(self, "workload") else self.train_trace.metadata
        return PredictorCost(cpu_s_per_prediction=prediction_cpu_s(self.readout.d),
                             tap_fraction=tap_fraction(meta, self.column),
                             gpu_s_per_refresh=REFRESH_GPU_S if self.use_refresh else 0.0)

    @property
    def prior_length(self) -> float:
        return float(self.readout.prior_length)

    def describe(self) -> dict:
        out = {"name": self.name, **self.readout.describe()}
        out["cpu_s_per_prediction"] = prediction_cpu_s(self.readout.d)
        out["tap_fraction"] = self.cost().tap_fraction
        out["refresh"] = self.use_refresh
        if self.use_refresh and getattr(self, "_decode", None) is not None:
            out["refresh_every"] = self.refresh_every
            out["refresh_readout"] = self._decode.decoder.describe()
            out["refresh_gpu_s"] = REFRESH_GPU_S
        return out
