"""weighted: llm-d's endpoint picker: a weighted sum of scorers, each in [0, 1] per replica
(routers/scorers.py), the highest total wins (ties to fewer outstanding, then the lowest index).
Scorers and weights from ``--router weighted:SCORER=W,...``: ``precise-prefix`` (the replicas'
actual caches), ``prefix`` (the router's own index of what it routed, as prefix-affinity),
``queue-depth``, ``kv-utilization``; default llm-d's (as BLIS mirrors it): precise-prefix 2,
queue-depth 1, kv-utilization 1. ``lag=S``: the replicas' counters lag (docs/semantics.md "Fleets")."""

from __future__ import annotations

import numpy as np

from routers.base import FleetView, Router
from routers.prefix_affinity import PrefixAffinity
from routers.scorers import best, kv_utilization, precise_prefix, queue_depth, settings

DEFAULT_WEIGHTS = {"precise-prefix": 2.0, "queue-depth": 1.0, "kv-utilization": 1.0}
SCORERS = ("precise-prefix", "prefix", "queue-depth", "kv-utilization")


class Weighted(Router):
    name = "weighted"
    reads = "cache"
    stages = ("arrival",)   # reads what only an arrival fleet's view holds (prompt keys, caches)

    def configure(self, args: str) -> None:
        given = settings(self.name, args)
        self.lag = given.pop("lag", 0.0)
        unknown = [k for k in given if k not in SCORERS]
        if unknown:
            raise ValueError(f"--router {self.name}: unknown scorer {unknown[0]!r} (choose from {', '.join(SCORERS)})")
        self.weights = {k: v for k, v in (given or DEFAULT_WEIGHTS).items() if v > 0}
        if not self.weights:
            raise ValueError(f"--router {self.name}:{args}: every weight is 0")
        self.needs_cache = "precise-prefix" in self.weights   # type: ignore[misc]
        self.needs_kv = self.needs_cache or "kv-utilization" in self.weights   # type: ignore[misc]
        self.index = PrefixAffinity()
        self.index.configure("")

    def reset(self, replicas: int, seed: int) -> None:
        super().reset(replicas, seed)
        self.index.reset(replicas, seed)

    def choose(self, row: int, view: FleetView) -> int:
        total = np.zeros(self.replicas)
        keys = view.prompt_keys or []
        for scorer, weight in self.weights.items():
            if scorer == "precise-prefix":
                score = precise_prefix(view)
            elif scorer == "prefix":
                score = self.index.matched(keys) / float(max(len(keys), 1))
            elif scorer == "queue-depth":
                score = queue_depth(view)
            else:
                score = kv_utilization(view)
            total += weight * score
        chosen = best(total, view.outstanding)
        if "prefix" in self.weights:
            self.index.remember(chosen, keys, view.kv_total)
        return chosen

    def describe(self) -> dict:
        return {**super().describe(), "weights": self.weights, "lag": self.lag}
