"""Fleet routers, registered by CLI name (``simulate --router NAME``). Adding one = one file + one line here."""

from __future__ import annotations

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


def make_router(name: str) -> Router:
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown --router {name!r} (choose from {', '.join(ROUTERS)})") from None


__all__ = ["DEFAULT_ROUTER", "MAX_REPLICAS", "ROUTERS", "FleetView", "Router", "make_router"]
