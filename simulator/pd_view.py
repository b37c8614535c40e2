"""What a P/D fleet's decode router reads of the decode instances (docs/semantics.md
"Prefill/decode disaggregation"), when a request's prefill ends: the decode instances' accounting
(routers/snapshot.py), and the fields it does not keep, computed only for a router that reads them.
A decode instance's requests are those placed on it and not finished: queued for blocks, in transfer
(0 tokens generated there yet), or landed (waiting, resident or preempted)."""

from __future__ import annotations

from typing import Any

import numpy as np

from routers.base import FleetView

#: a :class:`simulator.pd_fleet.PDFleet` (not imported: it imports this module)
PDFleet = Any


def kv_blocks_of(tokens, size: int):
    """Blocks of ``size`` tokens holding ``tokens`` (an int or an array, rounded up)."""
    return -(-np.asarray(tokens) // size)


def _requests(fleet: PDFleet, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(prompt, generated, estimate, true length) of the decode instance's unfinished requests."""
    pending = np.asarray(fleet.queued[index] + fleet.in_flight[index], dtype=np.int64)
    decoder = fleet.decoders[index]
    t, rows = decoder.parts.table, decoder.unfinished()
    prompt = np.concatenate([fleet.prompt[pending], t.prompt[rows]])
    generated = np.concatenate([np.zeros(len(pending), dtype=np.int64), t.generated[rows]])
    estimate = np.concatenate([fleet.carried[pending], t.predicted[rows]])
    length = np.concatenate([fleet.length[pending], t.length[rows]])
    return prompt, generated, estimate, length


def _kv_used(fleet: PDFleet, index: int) -> int:
    """Blocks held or reserved, and the prompt blocks of the transfers queued for blocks."""
    size = fleet.config.kv_block_size
    queued = int(kv_blocks_of(fleet.prompt[fleet.queued[index]], size).sum())
    kv = fleet.decoders[index].parts.scheduler.kv
    if kv is not None:
        return kv.used + queued
    prompt, generated, _, _ = _requests(fleet, index)   # unbounded KV: what rule 2 would hold
    return int(kv_blocks_of(prompt + np.maximum(generated - 1, 0), size).sum())


def _footprint(prompt: np.ndarray, generated: np.ndarray, lengths: np.ndarray, size: int) -> float:
    """Sum of peak blocks (prompt + output) x tokens left, over the requests."""
    left = np.maximum(lengths - generated, 1.0)
    return float((np.ceil((prompt + lengths) / size) * left).sum())


def decode_view(fleet: PDFleet, reads: str) -> FleetView:
    """The decode router's view: the decode accounting's counters (routers/snapshot.py: requests,
    work, true work, kept at each event); "kv": KV blocks claimed (set from the instances when read);
    the KV footprints (predicted or true) summed over the requests when read."""
    accounting = fleet.decode_accounting
    d, size = fleet.decode_replicas, fleet.config.kv_block_size
    if reads == "kv":
        for i in range(d):
            accounting.set_kv(i, _kv_used(fleet, i))
    if reads not in ("predicted_kv", "true_kv"):
        return accounting.view(reads)
    values = np.zeros(d, dtype=np.float64)
    for i in range(d):
        prompt, generated, estimate, length = _requests(fleet, i)
        lengths = estimate if reads == "predicted_kv" else length.astype(np.float64)
        values[i] = _footprint(prompt, generated, lengths, size)
    if reads == "predicted_kv":
        return FleetView(replicas=d, kv_predicted=values)
    return FleetView(replicas=d, kv_true=values)
