"""prefix-affinity: llm-d's approximate prefix scorer. The router indexes what it routed (each
replica: the prompt block keys of the requests sent there, the most recent ``capacity`` kept,
default the replica's KV blocks, unbounded without them) and sends a request where the longest run
of its leading blocks was sent before; ties (and no match) to fewer outstanding requests, then the
lowest index. It reads no replica's cache: an evicted block still attracts."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from routers.base import FleetView, Router
from routers.scorers import best, known_settings


class PrefixAffinity(Router):
    name = "prefix-affinity"
    reads = "prefix"
    stages = ("arrival",)   # reads what only an arrival fleet's view holds (prompt keys, caches)

    def configure(self, args: str) -> None:
        given = known_settings(self.name, args, {"lag": 0.0, "capacity": 0.0})
        self.lag, self.capacity = given["lag"], int(given["capacity"]) or None

    def reset(self, replicas: int, seed: int) -> None:
        super().reset(replicas, seed)
        self.index: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]

    def matched(self, keys: list) -> np.ndarray:
        out = np.zeros(self.replicas, dtype=np.int64)
        for r, seen in enumerate(self.index):
            for key in keys:
                if key not in seen:
                    break
                out[r] += 1
        return out

    def choose(self, row: int, view: FleetView) -> int:
        keys = view.prompt_keys or []
        chosen = best(self.matched(keys).astype(np.float64), view.outstanding)
        self.remember(chosen, keys, view.kv_total)
        return chosen

    def remember(self, replica: int, keys: list, kv_total: int | None) -> None:
        seen = self.index[replica]
        for key in keys:
            seen[key] = None
            seen.move_to_end(key)
        limit = self.capacity or kv_total
        while limit and len(seen) > limit:
            seen.popitem(last=False)
