"""precise-prefix: llm-d's precise prefix-cache scorer. The request goes to the replica whose
actual prefix cache holds the most of its leading prompt blocks (docs/semantics.md "Prefix
caching": the blocks its admission would find now); ties to fewer outstanding requests, then the
lowest index. Needs the replicas' caches (``--kv-blocks``, prefix caching on)."""

from __future__ import annotations

from routers.base import FleetView, Router
from routers.scorers import best, known_settings, precise_prefix


class PrecisePrefix(Router):
    name = "precise-prefix"
    reads = "cache"
    stages = ("arrival",)   # reads what only an arrival fleet's view holds (prompt keys, caches)
    needs_kv = needs_cache = True
    live_cache = True   # a live fleet reads each replica's vLLM cache (live/fleet_cache.py)

    def configure(self, args: str) -> None:
        self.lag = known_settings(self.name, args, {"lag": 0.0})["lag"]

    def choose(self, row: int, view: FleetView) -> int:
        return best(precise_prefix(view), view.outstanding)
