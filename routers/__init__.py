"""Fleet routers, registered by CLI name (``simulate --router NAME``). Adding one = one file + one line here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from routers.base import ESTIMATE_READS, FleetView, Router
from routers.kv_cost import KvCost
from routers.kv_utilization import KvUtilization
from routers.least_kv import LeastKV
from routers.least_predicted_kv import LeastPredictedKV
from routers.least_requests import LeastRequests
from routers.least_work import LeastWork
from routers.oracle_kv import OracleKV
from routers.oracle_work import OracleWork
from routers.power_of_two import PowerOfTwo
from routers.precise_prefix import PrecisePrefix
from routers.prefix_affinity import PrefixAffinity
from routers.queue_depth import QueueDepth
from routers.round_robin import RoundRobin
from routers.vllm_dp import VllmDp
from routers.weighted import Weighted

#: Every router by CLI name; each declares where it may place requests (``Router.stages``).
ALL_ROUTERS: dict[str, type[Router]] = {
    "round-robin": RoundRobin,
    "least-requests": LeastRequests,
    "power-of-two": PowerOfTwo,
    "least-work": LeastWork,
    "oracle-work": OracleWork,
    # decode routers of a prefill/decode fleet (docs/semantics.md "Prefill/decode disaggregation")
    "least-kv": LeastKV,
    "least-predicted-kv": LeastPredictedKV,
    "oracle-kv": OracleKV,
    # cache- and KV-aware (docs/semantics.md "Cache-aware routers"); settings: --router NAME:K=V,...
    "prefix-affinity": PrefixAffinity,
    "precise-prefix": PrecisePrefix,
    "kv-utilization": KvUtilization,
    "queue-depth": QueueDepth,
    "vllm-dp": VllmDp,
    "weighted": Weighted,
    "kv-cost": KvCost,
}
#: Routers placing arrivals (``--router``); routers placing prefilled requests on decode instances
#: of a prefill/decode fleet (``--decode-router``).
ROUTERS = {name: cls for name, cls in ALL_ROUTERS.items() if "arrival" in cls.stages}
DECODE_ROUTERS = {name: cls for name, cls in ALL_ROUTERS.items() if "decode" in cls.stages}

DEFAULT_ROUTER = "round-robin"
#: Most replicas one fleet simulates (each holds a whole engine's state).
MAX_REPLICAS = 4096


def serves(router: str | Router | type[Router], predictor: Any) -> bool:
    """Whether ``predictor`` (a predictor class or instance; None: no predictor) gives ``router`` (a
    registered name, ``NAME:SETTINGS``, or a router) what it reads: a router reading estimates needs a
    routing estimate (``Predictor.router_estimate()``)."""
    reads = (ALL_ROUTERS[router.partition(":")[0]] if isinstance(router, str) else router).reads
    return reads not in ESTIMATE_READS or (predictor is not None and predictor.router_estimate() is not None)


def check_replicas(replicas: int) -> None:
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"--replicas must be an integer from 1 to {MAX_REPLICAS}, got {replicas!r}")


def check_fleet_pair(replicas: int, router: str | Router, predictors: Mapping[str, Any], predictor: str,
                     flag: str = "--router") -> None:
    """The rules of a fleet's replicas and its router/predictor pair, written once: replicas in
    range, and a predictor (looked up in ``predictors``) able to serve the router."""
    check_replicas(replicas)
    if not serves(router, predictors.get(predictor)):
        name = router.partition(":")[0] if isinstance(router, str) else router.name
        able = ", ".join(n for n, c in predictors.items() if serves(router, c))
        what = ALL_ROUTERS[name].reads.replace("_", " ").replace(" kv", " KV footprints")
        raise ValueError(f"{flag} {name} reads {what}: --predictor {predictor} cannot serve it (choose from {able})")


def check_router(replicas: int, router: str, predictors: Mapping[str, Any], predictor: str) -> None:
    """A fleet's replicas and router, before anything is loaded (the simulator's and the live fleet's
    one check): a known arrival router with settings it accepts, and :func:`check_fleet_pair`."""
    check_stage_router("--router", "arrival", router, predictors, predictor, replicas)


def check_stage_router(flag: str, stage: str, spec: str, predictors: Mapping[str, Any], predictor: str,
                       replicas: int = 1) -> None:
    """A router given by ``flag`` (``NAME`` or ``NAME:SETTINGS``) for placements at ``stage``: known,
    able to place there, settings it accepts, and :func:`check_fleet_pair`."""
    router = spec.partition(":")[0]
    able_here = [n for n, c in ALL_ROUTERS.items() if stage in c.stages]
    if router not in ALL_ROUTERS:
        raise ValueError(f"unknown {flag} {router!r} (choose from {', '.join(able_here)})")
    if stage not in ALL_ROUTERS[router].stages:
        raise ValueError(f"{flag} {router} places requests after prefill only (choose from {', '.join(able_here)})")
    make_router(spec)   # its settings, refused in one line
    check_fleet_pair(replicas, spec, predictors, predictor, flag)


def make_router(spec: str) -> Router:
    """``NAME`` or ``NAME:SETTINGS`` (``weighted:precise-prefix=2,queue-depth=1``), configured."""
    name, _, args = spec.partition(":")
    try:
        router = ALL_ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown --router {name!r} (choose from {', '.join(ALL_ROUTERS)})") from None
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


__all__ = ["ALL_ROUTERS", "DECODE_ROUTERS", "DEFAULT_ROUTER", "MAX_REPLICAS", "ROUTERS", "FleetView", "Router",
           "check_fleet_pair", "check_replicas", "check_router", "check_router_cache", "check_stage_router",
           "make_router", "serves"]
