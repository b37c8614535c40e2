"""kv-utilization: llm-d's KV-cache-utilization scorer alone: the replica with the smallest share
of its KV blocks held; ties to fewer outstanding requests, then the lowest index. Needs ``--kv-blocks``."""

from __future__ import annotations

from routers.base import FleetView, Router
from routers.scorers import best, kv_utilization, settings


class KvUtilization(Router):
    name = "kv-utilization"
    reads = "cache"
    stages = ("arrival",)   # reads what only an arrival fleet's view holds (prompt keys, caches)
    needs_kv = True

    def configure(self, args: str) -> None:
        given = settings(self.name, args)
        self.lag = given.pop("lag", 0.0)
        if given:
            raise ValueError(f"--router {self.name}: unknown setting {next(iter(given))!r} (lag)")

    def choose(self, row: int, view: FleetView) -> int:
        return best(kv_utilization(view), view.outstanding)
