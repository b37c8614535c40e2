"""Shared machinery of the trained baselines (TIE, SSJF, LTR, TRAIL, EGTP): numpy inference of
small MLP heads, weight files, and where trained weights come from.

Inference needs only numpy: a head is a list of ops (``linear``, ``layernorm``, ``relu``, ``gelu``
(tanh approximation, the same in torch), ``dropout`` (identity at inference)) described in JSON,
plus its arrays. Training (torch, optional extra ``train``) lives in :mod:`predictors.training`
and writes the same format.

Weight files (``.npz``): every array of every head of one method, plus ``__meta__`` (JSON bytes):
method, artifact version, the training trace's name and content hash, the settings, the artifact
``key`` (a hash of method, version, trace hash and settings), head specs and training notes.
Weight matrices are stored as float16 (halving the shipped files; the cache and the shipped copy
use the same rounding, so a retrained artifact predicts exactly like the shipped one); biases,
norms and standardisation statistics stay float32.

Where an artifact comes from (:func:`resolve_artifact`), in order:
1. ``cache_dir()/baselines/METHOD-KEY.npz`` (written atomically after training);
2. the shipped ``predictors/weights/METHOD.npz`` when its key matches (same training trace content
   hash and settings) -- this is how a fresh install without torch runs every baseline;
3. training with torch (only when neither matches, or when ``retrain`` is asked); without torch
   this fails with one :class:`TrainingUnavailable` message naming the method and the trace.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from core.io import atomic_write_bytes, cache_dir
from core.trace import Trace, load_trace
from predictors.base import Predictor, PredictorOptions

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
META_KEY = "__meta__"
GELU_C = math.sqrt(2.0 / math.pi)


class TrainingUnavailable(ValueError):
    """Weights must be trained but torch is not installed (a ValueError, so CLIs print one line)."""


# ----------------------------------------------------------------------------- head specs
def linear(name: str, n_in: int, n_out: int) -> dict:
    return {"op": "linear", "name": name, "in": int(n_in), "out": int(n_out)}


def layernorm(name: str, dim: int, eps: float = 1e-5) -> dict:
    return {"op": "layernorm", "name": name, "dim": int(dim), "eps": float(eps)}


def act(kind: str) -> dict:
    if kind not in ("relu", "gelu"):
        raise ValueError(f"unknown activation {kind!r}")
    return {"op": kind}


def dropout(p: float) -> dict:
    return {"op": "dropout", "p": float(p)}


def spec_in_out(spec: list[dict]) -> tuple[int, int]:
    lin = [op for op in spec if op["op"] == "linear"]
    return lin[0]["in"], lin[-1]["out"]


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x * x * x)))


def softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


class Head:
    """A numpy MLP head: optional input standardisation, then the ops of its spec."""

    def __init__(self, name: str, spec: list[dict], arrays: dict[str, np.ndarray]):
        self.name, self.spec = name, spec
        self.x_mean = arrays.get(f"{name}.x_mean")
        self.x_scale = arrays.get(f"{name}.x_scale")
        self._ops: list[tuple] = []
        for op in spec:
            kind = op["op"]
            if kind == "linear":
                w = np.asarray(arrays[f"{name}.{op['name']}.w"], dtype=np.float32)
                b = np.asarray(arrays[f"{name}.{op['name']}.b"], dtype=np.float32)
                if w.shape != (op["in"], op["out"]) or b.shape != (op["out"],):
                    raise ValueError(f"head {name}: {op['name']} has shape {w.shape}, expected "
                                     f"({op['in']}, {op['out']})")
                self._ops.append(("linear", w, b))
            elif kind == "layernorm":
                g = np.asarray(arrays[f"{name}.{op['name']}.g"], dtype=np.float32)
                b = np.asarray(arrays[f"{name}.{op['name']}.b"], dtype=np.float32)
                self._ops.append(("layernorm", g, b, op["eps"]))
            elif kind in ("relu", "gelu"):
                self._ops.append((kind,))
            elif kind == "dropout":
                continue
            else:
                raise ValueError(f"head {name}: unknown op {kind!r}")
        self.n_in, self.n_out = spec_in_out(spec)

    @property
    def params(self) -> int:
        return int(sum(op[1].size + op[2].size for op in self._ops if op[0] in ("linear", "layernorm")))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward(self.standardize(x))

    def standardize(self, x: np.ndarray) -> np.ndarray:
        """The head's input (float32 rows), standardised when it has a mean and scale: elementwise,
        so rows standardised together or apart get the same bits."""
        x = np.asarray(x, dtype=np.float32)
        if x.ndim == 1:
            x = x[None, :]
        if x.shape[1] != self.n_in:
            raise ValueError(f"head {self.name}: input has {x.shape[1]} dimensions, expected {self.n_in}")
        if self.x_mean is not None:
            x = ((x.astype(np.float64) - self.x_mean) / self.x_scale).astype(np.float32)
        return x

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The ops on standardised float32 rows (:meth:`standardize`)."""
        for op in self._ops:
            kind = op[0]
            if kind == "linear":
                x = x @ op[1] + op[2]
            elif kind == "layernorm":
                mu = x.mean(axis=1, keepdims=True)
                var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
                x = (x - mu) / np.sqrt(var + op[3]) * op[1] + op[2]
            elif kind == "relu":
                x = np.maximum(x, 0.0)
            else:
                x = gelu_tanh(x)
        return x.astype(np.float64)


def standardization(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and population std (1 where the std is 0), float64."""
    X = np.asarray(X, dtype=np.float64)
    mean = X.mean(axis=0)
    std = X.std(axis=0)
    return mean, np.where(std > 1e-12, std, 1.0)


# ----------------------------------------------------------------------------- artifacts
@dataclass
class Artifact:
    """One method's trained weights: arrays (head params, bins, stats) and metadata."""

    method: str
    arrays: dict[str, np.ndarray]
    meta: dict
    source: str = "memory"          # "cache", "shipped", "trained" or "memory"
    path: Path | None = None
    _heads: dict = field(default_factory=dict, repr=False)

    def head(self, name: str) -> Head:
        if name not in self._heads:
            self._heads[name] = Head(name, self.meta["heads"][name], self.arrays)
        return self._heads[name]

    @property
    def settings(self) -> dict:
        return self.meta.get("settings", {})

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        meta = np.frombuffer(json.dumps(self.meta, sort_keys=True).encode(), dtype=np.uint8)
        arrays: dict[str, Any] = {META_KEY: meta, **self.arrays}   # Any: numpy's stub types allow_pickle too
        np.savez_compressed(buf, **arrays)
        return buf.getvalue()

    def save(self, path: Path) -> None:
        atomic_write_bytes(Path(path), self.to_bytes())

    def describe(self) -> dict:
        return {"weights": self.source, "weights_file": self.path.name if self.path else None,
                "train_trace": self.meta.get("train_name"), "train_hash": self.meta.get("train_hash"),
                "artifact_key": self.meta.get("key"), "settings": self.settings,
                "train_seconds": self.meta.get("train_seconds")}


def pack_arrays(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Storage dtypes: linear weights (``*.w``) float16, everything else float32 (int kept)."""
    out = {}
    for k, v in arrays.items():
        v = np.asarray(v)
        if np.issubdtype(v.dtype, np.integer):
            out[k] = v
        elif k.endswith(".w"):
            out[k] = v.astype(np.float16)
        else:
            out[k] = v.astype(np.float32)
    return out


def load_artifact(path: Path, source: str) -> Artifact | None:
    """Read a weight file; None if it is missing or unreadable (it is then retrained)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files if k != META_KEY}
            meta = json.loads(bytes(data[META_KEY].tobytes()).decode())
    except (OSError, ValueError, KeyError, json.JSONDecodeError):
        return None
    return Artifact(method=meta.get("method", "?"), arrays=arrays, meta=meta, source=source, path=Path(path))


def artifact_key(method: str, version: int, train_hash: str, settings: dict) -> str:
    material = json.dumps({"method": method, "v": version, "trace": train_hash, "settings": settings},
                          sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:20]


def cache_path(method: str, key: str) -> Path:
    return cache_dir() / "baselines" / f"{method}-{key}.npz"


def shipped_path(method: str) -> Path:
    return WEIGHTS_DIR / f"{method}.npz"


def have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_artifact(method: str, version: int, settings: dict, train_trace: str | Trace,
                     trainer: Callable[[Trace, dict], Artifact], *, retrain: bool = False) -> Artifact:
    """Cached, shipped or freshly trained weights for ``method`` on ``train_trace`` (see module doc)."""
    trace = train_trace if isinstance(train_trace, Trace) else load_trace(train_trace)
    key = artifact_key(method, version, trace.content_hash, settings)
    cached = cache_path(method, key)
    if not retrain:
        for path, source in ((cached, "cache"), (shipped_path(method), "shipped")):
            if path.is_file():
                art = load_artifact(path, source)
                if art is not None and art.meta.get("key") == key:
                    return art
    if not have_torch():
        raise TrainingUnavailable(
            f"predictor {method!r}: no cached or shipped weights for training trace {trace.name!r} "
            f"(hash {trace.content_hash[:12]}) with these settings, and training needs torch, which is "
            f"not installed (pip install -e '.[train]')")
    art = trainer(trace, settings)
    art.meta["key"] = key
    art.source = "trained"
    art.save(cached)
    art.path = cached
    return art


def new_artifact(method: str, version: int, trace: Trace, settings: dict, heads: dict[str, list[dict]],
                 arrays: dict[str, np.ndarray], **notes) -> Artifact:
    """Package trained arrays (called by the trainers)."""
    meta = {"method": method, "version": version, "train_name": trace.name, "train_hash": trace.content_hash,
            "train_rows": len(trace), "settings": settings, "heads": heads,
            "key": artifact_key(method, version, trace.content_hash, settings), **notes}
    return Artifact(method=method, arrays=pack_arrays(arrays), meta=meta, source="trained")


def merged_settings(defaults: dict, extra: dict | None) -> dict:
    """Training defaults overridden by entries of the same name (unknown keys ignored)."""
    settings = dict(defaults)
    for k, v in (extra or {}).items():
        if k in settings:
            settings[k] = type(defaults[k])(v) if defaults[k] is not None and not isinstance(defaults[k], (list, tuple)) else v
    return settings


class HeadPredictor(Predictor):
    """A predictor whose weights are one :class:`Artifact` trained by its method's ``trainer``:
    shipped, cached or trained on ``PredictorOptions.train_trace`` (see :func:`resolve_artifact`)."""

    learned = True
    method: ClassVar[str]
    version: ClassVar[int]
    defaults: ClassVar[dict]

    @staticmethod
    def trainer(trace: Trace, settings: dict) -> Artifact:
        """Train the method's arrays on ``trace`` (each head sets its own: ``staticmethod(train)``)."""
        raise NotImplementedError

    def __init__(self, artifact: Artifact):
        """Single-input heads read ``settings["column"]`` (default: the class's ``requires``)."""
        self.artifact = artifact
        self.column = artifact.settings.get("column", self.requires[0])
        self.requires = (self.column,)

    def __init_subclass__(cls, **kwargs):
        """Settings: the method's training settings (its defaults) + ``retrain`` (ignore the caches)."""
        super().__init_subclass__(**kwargs)
        if "defaults" in cls.__dict__:
            cls.settings_defaults = {**{k: v for k, v in cls.defaults.items()
                                        if not isinstance(v, (list, tuple, dict))},
                                     **cls.__dict__.get("own_settings", {}), "retrain": False}

    @classmethod
    def artifact_for(cls, options: PredictorOptions) -> Artifact:
        settings = cls.settings(options)
        retrain = settings.pop("retrain")
        return resolve_artifact(cls.method, cls.version, merged_settings(cls.defaults, settings),
                                options.train_trace or "lmsys", cls.trainer, retrain=retrain)

    @classmethod
    def from_options(cls, options: PredictorOptions) -> HeadPredictor:
        return cls(cls.artifact_for(options))

    @classmethod
    def fit(cls, trace: Trace, **overrides) -> HeadPredictor:
        """Train on an in-memory trace (tests, scripts), bypassing the caches."""
        return cls(cls.trainer(trace, merged_settings(cls.defaults, overrides)))
