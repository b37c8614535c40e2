"""The trained LEAP read-out as a small file the live engine loads (``python -m live.readout``).

The file is predictors/leap.py's fitted read-out (standardise, ridge on sqrt(length), clip,
square; lambda by cross-validation on the training trace) plus the penalised Gram matrix
``A = U^T U + lambda D`` that anchors leap-rls, and the facts a live engine must match before it
starts: the serving model's id and hidden size, and the tapped layer. The math stays in
predictors/leap.py (``LinearReadout``, ``AnchoredRLS``); this module only stores and checks it.

    python -m live.readout --train traces/lmsys.parquet --out leap_readout.npz
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from live.common import HOOK_FEATURE, LiveConfigError

FORMAT = "leap-readout/1"


@dataclass(frozen=True)
class ReadoutFile:
    """What a read-out file holds; ``readout`` is predictors.leap's LinearReadout (the math)."""

    path: str
    info: dict               # format, layer, hidden_size, model_id, column, target, cap, ...
    mean: np.ndarray
    scale: np.ndarray
    theta: np.ndarray        # ridge weights over standardised features, bias last
    gram: np.ndarray         # A = U^T U + lambda D (the RLS anchor's inverse P0)

    @property
    def readout(self):
        return _linear_readout(self)

    def folded(self) -> tuple[np.ndarray, float, float, float, bool, float]:
        """Raw-space float32 weights, bias, clip range, square?, cap: the hook's serving fast path."""
        return self.readout._raw


def _linear_readout(f: ReadoutFile):
    from core.readout import LinearReadout

    i = f.info
    return LinearReadout(mean=f.mean, scale=f.scale, theta=f.theta, target=i["target"], cap=i["cap"],
                         lam=i["lam"], prior_length=i["prior_length"], column=i["column"], layer=i["layer"],
                         train_name=i["train_name"], train_hash=i["train_hash"])


def export_readout(train: str, out: str | Path) -> ReadoutFile:
    """Fit (or load from the fit cache) LEAP's read-out on ``train`` and write it to ``out`` atomically."""
    from core.io import atomic_write_bytes
    from core.readout import DEFAULT_TARGET, fit_readout
    from core.trace import load_trace

    trace = load_trace(train)
    readout, gram = fit_readout(trace, HOOK_FEATURE, DEFAULT_TARGET, want_gram=True)
    if gram is None:   # want_gram=True always returns it
        raise RuntimeError(f"trace {trace.name}: the read-out fit returned no gram matrix")
    meta = trace.metadata
    layer = readout.layer if readout.layer is not None else (meta.get("layers") or {}).get(HOOK_FEATURE)
    if not isinstance(layer, int):
        raise LiveConfigError(f"trace {trace.name}: its metadata names no layer for {HOOK_FEATURE}")
    info = {"format": FORMAT, "layer": int(layer), "hidden_size": int(readout.d),
            "model_id": meta.get("model_id"), "model_revision": meta.get("model_revision"),
            "num_layers": meta.get("num_layers"), "column": HOOK_FEATURE, "target": readout.target,
            "cap": int(readout.cap), "lam": float(readout.lam), "alpha": readout.alpha,
            "prior_length": float(readout.prior_length), "n_train": int(readout.n_train),
            "train_name": trace.name, "train_hash": trace.content_hash}
    buf = io.BytesIO()
    np.savez(buf, mean=readout.mean, scale=readout.scale, theta=readout.theta, gram=gram,
             info=np.array(json.dumps(info, sort_keys=True)))
    atomic_write_bytes(Path(out), buf.getvalue())
    return load_readout(str(out))


@lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int, size: int) -> ReadoutFile:
    try:
        with np.load(path, allow_pickle=False) as data:
            info = json.loads(str(data["info"]))
            arrays = {k: np.array(data[k], dtype=np.float64) for k in ("mean", "scale", "theta", "gram")}
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise LiveConfigError(f"cannot read read-out file {path}: {str(e).splitlines()[0] if str(e) else e}") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise LiveConfigError(f"{path} is not a LEAP read-out file (format {FORMAT})")
    if info.get("column") != HOOK_FEATURE:
        raise LiveConfigError(f"read-out {path} reads feature {info.get('column')!r}; the live hook captures "
                              f"only {HOOK_FEATURE} (the tapped layer's last-prompt-token state)")
    d = arrays["mean"].shape[0] if arrays["mean"].ndim == 1 else -1
    if (d != info.get("hidden_size") or arrays["scale"].shape != (d,) or arrays["theta"].shape != (d + 1,)
            or arrays["gram"].shape != (d + 1, d + 1)):
        raise LiveConfigError(f"read-out {path}: array shapes do not match its hidden size {info.get('hidden_size')}")
    if not all(np.isfinite(a).all() for a in arrays.values()):
        raise LiveConfigError(f"read-out {path} holds non-finite values")
    return ReadoutFile(path=path, info=info, **arrays)


def load_readout(path: str | Path | None) -> ReadoutFile:
    """A checked read-out file (cached per path and modification time)."""
    if not path:
        raise LiveConfigError("no read-out file given")
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise LiveConfigError(f"read-out file not found: {p}") from None
    if not p.is_file():
        raise LiveConfigError(f"read-out path is not a file: {p}")
    return _load(str(p), st.st_mtime_ns, st.st_size)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m live.readout",
                                 description="Export LEAP's trained read-out for a live vLLM engine.")
    ap.add_argument("--train", default="lmsys", help="training trace (bundled name or path)")
    ap.add_argument("--out", required=True, help="output .npz")
    args = ap.parse_args(argv)
    from core.trace import TraceError

    try:
        f = export_readout(args.train, args.out)
    except (LiveConfigError, TraceError, ValueError, OSError) as e:
        print(f"live.readout: {e}", file=sys.stderr)
        return 2
    i = f.info
    print(f"wrote {args.out}: layer {i['layer']}, hidden size {i['hidden_size']}, model {i['model_id']}, "
          f"trained on {i['train_name']} ({i['n_train']} requests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
