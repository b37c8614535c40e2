"""least-kv (decode router): the decode replica with the most free KV blocks, i.e. the fewest blocks
held, reserved for transfers or queued for (docs/semantics.md "Prefill/decode disaggregation"); ties
to the lowest index."""

from __future__ import annotations

from routers.base import FleetView, Router, lowest


class LeastKV(Router):
    name = "least-kv"
    reads = "kv"
    stages = ("decode",)

    def choose(self, row: int, view: FleetView) -> int:
        assert view.kv_used is not None
        return lowest(view.kv_used)
