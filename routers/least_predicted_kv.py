"""least-predicted-kv (decode router): the decode replica with the smallest predicted KV footprint
over its residents' remaining lives: each unfinished request's predicted peak blocks (prompt +
estimated output) weighted by its predicted tokens left (docs/semantics.md "Prefill/decode
disaggregation"); ties to the lowest index."""

from __future__ import annotations

from routers.base import FleetView, Router, lowest


class LeastPredictedKV(Router):
    name = "least-predicted-kv"
    reads = "predicted_kv"
    stages = ("decode",)

    def choose(self, row: int, view: FleetView) -> int:
        assert view.kv_predicted is not None
        return lowest(view.kv_predicted)
