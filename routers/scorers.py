"""The per-replica scores the cache-aware routers share (llm-d's endpoint-picker scorers), each in
[0, 1], higher better, from the :class:`routers.base.FleetView` of "prefix"/"cache" routers."""

from __future__ import annotations

import numpy as np

from routers.base import FleetView


def settings(name: str, args: str) -> dict[str, float]:
    """``k=v,k=v`` of ``--router NAME:ARGS`` as numbers >= 0 (one line naming the flag otherwise)."""
    out: dict[str, float] = {}
    for part in filter(None, args.split(",")):
        key, sep, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not sep or not key or not number >= 0 or number == float("inf"):
            raise ValueError(f"--router {name}:{args}: expected KEY=NUMBER (>= 0) items, got {part!r}")
        out[key.strip()] = number
    return out


def known_settings(name: str, args: str, defaults: dict[str, float]) -> dict[str, float]:
    """:func:`settings` over each key's default; a key not in ``defaults`` refused in one line."""
    given = settings(name, args)
    unknown = [key for key in given if key not in defaults]
    if unknown:
        raise ValueError(f"--router {name}: unknown setting {unknown[0]!r} ({', '.join(defaults)})")
    return {**defaults, **given}


def queue_depth(view: FleetView) -> np.ndarray:
    """Fewer waiting requests score higher: (max - waiting) / (max - min), all 1 when equal."""
    assert view.waiting is not None
    return _spread(-view.waiting.astype(np.float64))


def kv_utilization(view: FleetView) -> np.ndarray:
    """1 - the share of the replica's KV blocks held (all 1 where no KV blocks are modelled: the CLI
    refuses such a run, a fleet built in code ties)."""
    if view.kv_used is None or not view.kv_total:
        return np.ones(view.replicas)
    return 1.0 - view.kv_used / float(view.kv_total)


def precise_prefix(view: FleetView) -> np.ndarray:
    """The share of the request's prompt blocks cached at the replica (its actual cache; 0 without one)."""
    if view.hits is None or not view.prompt_keys:
        return np.zeros(view.replicas)
    return view.hits / float(len(view.prompt_keys))


def _spread(values: np.ndarray) -> np.ndarray:
    lo, hi = float(values.min()), float(values.max())
    return np.ones_like(values) if hi == lo else (values - lo) / (hi - lo)


def best(score: np.ndarray, outstanding: np.ndarray | None) -> int:
    """The highest score; ties to fewer outstanding requests, then the lowest index."""
    top = np.flatnonzero(score == score.max())
    if outstanding is not None and len(top) > 1:
        top = top[outstanding[top] == outstanding[top].min()]
    return int(top[0])
