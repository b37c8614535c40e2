"""kv-cost: NVIDIA Dynamo's KV router cost, the lowest wins (ties to fewer outstanding, then the
lowest index): overlap weight x prefill blocks + decode blocks, where prefill blocks = the request's
prompt blocks not cached at the replica (its actual cache) and decode blocks = the replica's blocks
held + the request's blocks for its prompt and expected output (the predictor's routing estimate
where it has one, else the prior: half the largest max_tokens). ``--router kv-cost:overlap=W``
(default 1, Dynamo's); ``lag=S``. Needs the replicas' caches (``--kv-blocks``, prefix caching on)."""

from __future__ import annotations

import math

import numpy as np

from routers.base import FleetView, Router
from routers.scorers import best, known_settings


class KvCost(Router):
    name = "kv-cost"
    reads = "cache"
    stages = ("arrival",)   # reads what only an arrival fleet's view holds (prompt keys, caches)
    needs_kv = needs_cache = True

    def configure(self, args: str) -> None:
        given = known_settings(self.name, args, {"overlap": 1.0, "lag": 0.0})
        self.lag, self.overlap = given["lag"], given["overlap"]

    def cost(self, view: FleetView) -> np.ndarray:
        size, keys = view.block_size, view.prompt_keys or []
        hits = view.hits if view.hits is not None else np.zeros(view.replicas, dtype=np.int64)
        held = view.kv_used if view.kv_used is not None else np.zeros(view.replicas, dtype=np.int64)
        prefill = np.maximum(len(keys) - hits, 0)
        own = math.ceil((len(keys) * size + (view.expected_output or 0.0)) / size)
        return self.overlap * prefill + held + own

    def choose(self, row: int, view: FleetView) -> int:
        return best(-self.cost(view), view.outstanding)

    def describe(self) -> dict:
        return {**super().describe(), "overlap": self.overlap, "lag": self.lag}
