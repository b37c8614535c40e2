"""vllm-dp: vLLM 0.32's data-parallel balancer (``DPLBAsyncMPClient.get_core_engine_for_request``
in ``vllm/v1/engine/core_client.py``), one client. Each replica scores
max(in flight, waiting + running) + waiting x 6 x max(0, KV usage - 0.5) (waiting requests are
penalised once more than half the KV blocks are held); the lowest score wins, replicas scanned from
a start index that moves on by one after every routing (the first of equal scores wins, so ties
rotate). ``in flight`` is the router's own count of what it routed and saw not finished (current);
waiting, running and KV usage come from the replicas' snapshot, which lags by ``lag`` seconds
(``--router vllm-dp:lag=0.1`` is vLLM's 100 ms; default 0), and between snapshots the chosen replica's
waiting count grows by one per request routed there, as vLLM's client counts locally."""

from __future__ import annotations

import numpy as np

from routers.base import FleetView, Router
from routers.scorers import known_settings


class VllmDp(Router):
    name = "vllm-dp"
    reads = "cache"
    stages = ("arrival",)   # reads what only an arrival fleet's view holds (prompt keys, caches)

    def configure(self, args: str) -> None:
        self.lag = known_settings(self.name, args, {"lag": 0.0})["lag"]

    def reset(self, replicas: int, seed: int) -> None:
        super().reset(replicas, seed)
        self.start = 0
        self.snapshot_at: float | None = None
        self.local = np.zeros(replicas, dtype=np.int64)

    def choose(self, row: int, view: FleetView) -> int:
        assert view.outstanding is not None and view.waiting is not None and view.running is not None
        if view.snapshot_at != self.snapshot_at:   # a fresh snapshot replaces the local counts
            self.snapshot_at = view.snapshot_at
            self.local[:] = 0
        waiting = view.waiting + self.local
        usage = (view.kv_used / float(view.kv_total) if view.kv_total and view.kv_used is not None
                 else np.zeros(self.replicas))
        score = np.maximum(view.outstanding, waiting + view.running).astype(np.float64)
        score += np.where(waiting > 0, waiting * 6.0 * np.maximum(0.0, usage - 0.5), 0.0)
        order = (self.start + np.arange(self.replicas)) % self.replicas
        chosen = int(order[int(np.argmin(score[order]))])
        self.local[chosen] += 1
        self.start = (self.start + 1) % self.replicas
        return chosen
