"""The router interface: which replica of a fleet an arriving request goes to.

A router is asked once per request, at its arrival (docs/semantics.md "Fleets"), with a
:class:`FleetView` of the replicas at that instant. It declares what it reads (``reads``), so the
fleet computes only that, and a router that reads predicted work needs a predictor able to serve
it (``Predictor.router_estimate()``). Ties go to the lowest replica index (``np.argmin``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

#: What a router reads of the fleet (routers/snapshot.py): nothing, requests outstanding (with their
#: waiting / running split), predicted work, true work, KV blocks; a decode router of a prefill/decode
#: fleet also predicted or true KV footprints (docs/semantics.md "Prefill/decode disaggregation").
#: "prefix": outstanding + the arriving request's prompt block keys (routers/cache_view.py); "cache":
#: that + KV blocks + each replica's cached blocks of the request + its expected output.
Reads = Literal["nothing", "outstanding", "predicted_work", "true_work", "kv", "predicted_kv", "true_kv", "prefix",
                "cache"]
#: Where a router places requests: at arrival (a fleet's --router, a P/D fleet's prefills) or after
#: prefill (a P/D fleet's --decode-router).
Stage = Literal["arrival", "decode"]


@dataclass(frozen=True)
class FleetView:
    """The replicas at a request's arrival; fields a router does not read are None."""

    replicas: int
    outstanding: np.ndarray | None = None     # per replica: routed, not finished (waiting + running)
    work: np.ndarray | None = None            # per replica: predicted outstanding output tokens
    true_work: np.ndarray | None = None       # per replica: true outstanding output tokens (oracle)
    waiting: np.ndarray | None = None         # per replica: routed, not resident (with ``outstanding``)
    running: np.ndarray | None = None         # per replica: resident, unfinished (with ``outstanding``)
    kv_used: np.ndarray | None = None         # per replica: KV blocks held ("kv"; a P/D decode replica's: claimed)
    kv_free: np.ndarray | None = None         # per replica: KV blocks free, -1 without KV blocks ("kv")
    kv_predicted: np.ndarray | None = None    # per decode replica: predicted KV footprint x tokens left
    kv_true: np.ndarray | None = None         # per decode replica: the same with true lengths (oracle)
    # the arriving request ("prefix", "cache"; routers/cache_view.py)
    prompt_keys: list | None = None           # its prompt's full blocks' keys at the block size
    hits: np.ndarray | None = None            # per replica: of those, the leading ones cached there ("cache")
    kv_total: int | None = None               # blocks per replica ("cache")
    block_size: int = 16
    expected_output: float | None = None      # its predicted output (the prior without one) ("cache")
    now: float = 0.0                          # the routing instant (seconds)
    snapshot_at: float = 0.0                  # when the replicas' counters were taken (lag)


class Router(ABC):
    """One routing rule. One file each, registered by CLI name in ``routers/__init__.py``."""

    name: ClassVar[str]
    reads: ClassVar[Reads] = "nothing"
    stages: ClassVar[tuple[Stage, ...]] = ("arrival", "decode")
    needs_kv: ClassVar[bool] = False       # reads KV blocks: refused on a run without --kv-blocks
    needs_cache: ClassVar[bool] = False    # reads replicas' prefix caches: refused without one
    live_cache: ClassVar[bool] = False     # a live fleet fills what it reads of the caches (live/fleet_cache.py)
    lag: float = 0.0                       # seconds the replicas' counters may lag ("prefix"/"cache" reads)
    # its compiled form: a function of routers/rules.py the compiled fleet loop compiles in (None: it
    # routes in Python on the compiled kernel too)
    compiled_rule: ClassVar[Callable | None] = None

    def configure(self, args: str) -> None:
        """``--router NAME:ARGS``: a router taking settings parses them here (one line, ValueError)."""
        if args:
            raise ValueError(f"--router {self.name} takes no settings, got {args!r}")

    def reset(self, replicas: int, seed: int) -> None:
        """Called once before a run routes its first request (state, RNG)."""
        self.replicas = replicas

    @abstractmethod
    def choose(self, row: int, view: FleetView) -> int:
        """The replica (0 .. replicas - 1) for the request of row ``row`` (rows in arrival order)."""

    def compiled_draws(self, requests: int) -> np.ndarray:
        """The random 32-bit words its compiled rule reads for ``requests`` routings (after ``reset``)."""
        return np.zeros(0, dtype=np.uint32)

    def describe(self) -> dict:
        return {"name": self.name, "reads": self.reads}


#: What each read needs of the predictor: an estimate ("predicted"), the true lengths, or nothing.
ESTIMATE_READS = ("predicted_work", "predicted_kv")


def lowest(values: np.ndarray) -> int:
    """The index of the smallest value, the lowest index among equals (the fleet's tie order)."""
    return int(np.argmin(values))
