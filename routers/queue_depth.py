"""queue-depth: llm-d's queue scorer alone: the replica with the fewest waiting requests (routed,
not resident: queued, part-prefilled or preempted); ties to fewer outstanding, then the lowest index."""

from __future__ import annotations

from routers.base import FleetView, Router
from routers.scorers import best, known_settings, queue_depth


class QueueDepth(Router):
    name = "queue-depth"
    reads = "prefix"
    stages = ("arrival",)   # reads what only an arrival fleet's view holds (prompt keys, caches)

    def configure(self, args: str) -> None:
        self.lag = known_settings(self.name, args, {"lag": 0.0})["lag"]

    def choose(self, row: int, view: FleetView) -> int:
        return best(queue_depth(view), view.outstanding)
