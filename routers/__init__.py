"""Fleet routers, registered by CLI name (``simulate --router NAME``). Adding one = one file + one line here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from routers.base import FleetView, Router
from routers.kv_cost import KvCost
from routers.kv_utilization import KvUtilization
from routers.least_requests import LeastRequests
from routers.least_work import LeastWork
from routers.oracle_work import OracleWork
from routers.power_of_two import PowerOfTwo
from routers.precise_prefix import PrecisePrefix
from routers.prefix_affinity import PrefixAffinity
from routers.queue_depth import QueueDepth
from routers.round_robin import RoundRobin
from routers.vllm_dp import VllmDp
from routers.weighted import Weighted

ROUTERS: dict[str, type[Router]] = {
    "round-robin": RoundRobin,
    "least-requests": LeastRequests,
    "power-of-two": PowerOfTwo,
    "least-work": LeastWork,
    "oracle-work": OracleWork,
    # cache- and KV-aware (docs/semantics.md "Cache-aware routers"); settings: --router NAME:K=V,...
    "prefix-affinity": PrefixAffinity,
    "precise-prefix": PrecisePrefix,
    "kv-utilization": KvUtilization,
    "queue-depth": QueueDepth,
    "vllm-dp": VllmDp,
    "weighted": Weighted,
    "kv-cost": KvCost,
}

DEFAULT_ROUTER = "round-robin"
#: Most replicas one fleet simulates (each holds a whole engine's state).
MAX_REPLICAS = 4096


def check_router(replicas: int, router: str, predictors: Mapping[str, Any], predictor: str) -> None:
    """A fleet's replicas and router, before anything is loaded (the simulator's and the live fleet's
    one check): replicas in range, a known router, and for a router reading predicted work a
    predictor (looked up in the registry ``predictors``) that can serve it."""
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"--replicas must be an integer from 1 to {MAX_REPLICAS}, got {replicas!r}")
    make_router(router)   # a known name, settings it accepts
    router = router.partition(":")[0]
    if ROUTERS[router].reads == "predicted_work":
        cls = predictors.get(predictor)
        if cls is None or cls.router_estimate() is None:
            able = ", ".join(n for n, c in predictors.items() if c.router_estimate() is not None)
            raise ValueError(f"--router {router} reads predicted work: --predictor {predictor} cannot serve it "
                             f"(choose from {able})")


def make_router(spec: str) -> Router:
    """``NAME`` or ``NAME:SETTINGS`` (``weighted:precise-prefix=2,queue-depth=1``), configured."""
    name, _, args = spec.partition(":")
    try:
        router = ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown --router {name!r} (choose from {', '.join(ROUTERS)})") from None
    router.configure(args)
    return router


def check_router_cache(spec: str, kv_blocks: bool, prefix_caching: bool) -> None:
    """A router reading KV blocks or the replicas' prefix caches on a run that models none: refused."""
    router = make_router(spec)
    if router.needs_cache and not prefix_caching:
        raise ValueError(f"--router {spec} reads the replicas' prefix caches: give --kv-blocks (prefix caching "
                         "is on with it unless --prefix-caching off)")
    if router.needs_kv and not kv_blocks:
        raise ValueError(f"--router {spec} reads KV blocks: give --kv-blocks N (or profile)")


__all__ = ["DEFAULT_ROUTER", "MAX_REPLICAS", "ROUTERS", "FleetView", "Router", "check_router", "check_router_cache",
           "make_router"]
