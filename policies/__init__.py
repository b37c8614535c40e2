"""Scheduling policies, registered by CLI name. Adding one = one file + one line here."""

from __future__ import annotations

from policies.aging import Aging
from policies.base import Policy, SchedulerView
from policies.countdown import Countdown
from policies.fcfs import FCFS
from policies.ltr_starvation import LTRStarvation
from policies.ssjf_starvation import SSJFStarvation
from policies.trail_preemption import TrailPreemption

POLICIES: dict[str, type[Policy]] = {
    "fcfs": FCFS,
    "countdown": Countdown,
    "aging": Aging,
    "ssjf-starvation": SSJFStarvation,
    "ltr-starvation": LTRStarvation,
    "trail-preemption": TrailPreemption,
}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (choose from {', '.join(POLICIES)})") from None


__all__ = ["POLICIES", "Policy", "SchedulerView", "make_policy"]
