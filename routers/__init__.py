"""Fleet routers, registered by CLI name (``simulate --router NAME``). Adding one = one file + one line here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from routers.base import FleetView, Router
from routers.least_requests import LeastRequests
from routers.least_work import LeastWork
from routers.oracle_work import OracleWork
from routers.power_of_two import PowerOfTwo
from routers.round_robin import RoundRobin

ROUTERS: dict[str, type[Router]] = {
    "round-robin": RoundRobin,
    "least-requests": LeastRequests,
    "power-of-two": PowerOfTwo,
    "least-work": LeastWork,
    "oracle-work": OracleWork,
}

DEFAULT_ROUTER = "round-robin"
#: Most replicas one fleet simulates (each holds a whole engine's state).
MAX_REPLICAS = 4096


def serves(router: str | Router | type[Router], predictor: Any) -> bool:
    """Whether ``predictor`` (a predictor class or instance; None: no predictor) gives ``router`` (a
    registered name, or a router) what it reads: predicted work needs a routing estimate
    (``Predictor.router_estimate()``)."""
    reads = (ROUTERS[router] if isinstance(router, str) else router).reads
    return reads != "predicted_work" or (predictor is not None and predictor.router_estimate() is not None)


def check_replicas(replicas: int) -> None:
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"--replicas must be an integer from 1 to {MAX_REPLICAS}, got {replicas!r}")


def check_fleet_pair(replicas: int, router: str | Router, predictors: Mapping[str, Any], predictor: str) -> None:
    """The rules of a fleet's replicas and its router/predictor pair, written once: replicas in
    range, and a predictor (looked up in ``predictors``) able to serve the router."""
    check_replicas(replicas)
    if not serves(router, predictors.get(predictor)):
        name = router if isinstance(router, str) else router.name
        able = ", ".join(n for n, c in predictors.items() if serves(router, c))
        raise ValueError(f"--router {name} reads predicted work: --predictor {predictor} cannot serve it "
                         f"(choose from {able})")


def check_router(replicas: int, router: str, predictors: Mapping[str, Any], predictor: str) -> None:
    """A fleet's replicas and router, before anything is loaded (the simulator's and the live fleet's
    one check): a known router, and :func:`check_fleet_pair`."""
    if router not in ROUTERS:
        raise ValueError(f"unknown --router {router!r} (choose from {', '.join(ROUTERS)})")
    check_fleet_pair(replicas, router, predictors, predictor)


def make_router(name: str) -> Router:
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown --router {name!r} (choose from {', '.join(ROUTERS)})") from None


__all__ = ["DEFAULT_ROUTER", "MAX_REPLICAS", "ROUTERS", "FleetView", "Router", "check_fleet_pair", "check_router", "make_router",
           "serves"]
