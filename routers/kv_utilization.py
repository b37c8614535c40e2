"""kv-utilization: llm-d's KV-cache-utilization scorer alone: the replica with the smallest share
of its KV blocks held; ties to fewer outstanding requests, then the lowest index. Needs ``--kv-blocks``."""

from __future__ import annotations

from routers.base import FleetView, Router
from routers.scorers import best, known_settings, kv_utilization


class KvUtilization(Router):
    name = "kv-utilization"
    reads = "cache"
    stages = ("arrival",)   # reads what only an arrival fleet's view holds (prompt keys, caches)
    needs_kv = True

    def configure(self, args: str) -> None:
        self.lag = known_settings(self.name, args, {"lag": 0.0})["lag"]

    def choose(self, row: int, view: FleetView) -> int:
        return best(kv_utilization(view), view.outstanding)
