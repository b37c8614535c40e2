"""What a cache-aware router reads beyond the accounting (routers/base.py ``reads`` "prefix" and
"cache"; docs/semantics.md "Fleets", "Cache-aware routers"): the arriving request's prompt block
keys (its trace's prefix hashes at ``--block-size``, its own keys beyond), each replica's cached
blocks of them (the leading ones, as the replica's lookup would find them, at most (prompt - 1) // B)
and its expected output (the routing estimate where the predictor serves one, else the prior: half
the largest max_tokens). Router state lag (``lag=S`` in ``--router NAME:...``): the counters a
router reads are a snapshot taken at most every S seconds (0: at every routing); the request's own
fields and the cached blocks are always current.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from routers.base import FleetView
from simulator.prefix_cache import BlockKeys


class CacheView:
    """One fleet run's cache-aware view maker (and the router's lagged counters)."""

    def __init__(self, fleet):
        self.fleet, self.size = fleet, fleet.config.kv_block_size
        self.keys = BlockKeys(fleet.fleet[0].parts.table, self.size)
        self.lag = float(getattr(fleet.router, "lag", 0.0))
        self.taken_at, self.counters = -np.inf, None

    def view(self, row: int, reads: str) -> FleetView:
        fleet = self.fleet
        now = float(fleet.arrival[row])   # a request is routed at its arrival instant
        current = fleet.accounting.view(reads)
        if self.counters is None or now >= self.taken_at + self.lag or self.lag <= 0:
            self.counters, self.taken_at = current, now
        prompt = int(fleet.prompt[row])
        keys = self.keys.of_request(row, prompt, prompt // self.size)
        # what the router itself routed and saw finish is current; the replicas' counters may lag
        view = replace(self.counters, outstanding=current.outstanding, prompt_keys=keys, block_size=self.size,
                       now=now, snapshot_at=self.taken_at)
        if reads != "cache":
            return view
        most = keys[:(prompt - 1) // self.size]
        hits = np.zeros(fleet.replicas, dtype=np.int64)
        for replica in fleet.fleet:
            hits[replica.index] = fleet.hit_blocks(replica, most)
        return replace(view, hits=hits, kv_total=fleet.config.kv_blocks_total if fleet.config.kv_bounded else None,
                       expected_output=self.expected(row))

    def expected(self, row: int) -> float:
        fleet = self.fleet
        if fleet.predictors and fleet.predictors[0].router_estimate() is not None:
            return fleet._routing_estimate(row)
        return float(fleet.workload.output_cap) / 2.0
