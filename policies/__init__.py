"""Scheduling policies, registered by CLI name. Adding one = one file + one line here."""

from __future__ import annotations

from collections.abc import Iterable

from policies.aging import Aging
from policies.base import Policy, SchedulerView
from policies.boost import Boost
from policies.countdown import Countdown
from policies.edf import EDF
from policies.fcfs import FCFS
from policies.hrrn import HRRN
from policies.ltr_starvation import LTRStarvation
from policies.mlfq import MLFQ
from policies.priority import Priority
from policies.settings import typed_settings
from policies.slack_countdown import SlackCountdown
from policies.slack_mlfq import SlackMLFQ
from policies.ssjf_starvation import SSJFStarvation
from policies.trail_preemption import TrailPreemption

POLICIES: dict[str, type[Policy]] = {
    "fcfs": FCFS,
    "countdown": Countdown,
    "aging": Aging,
    "ssjf-starvation": SSJFStarvation,
    "ltr-starvation": LTRStarvation,
    "trail-preemption": TrailPreemption,
    "hrrn": HRRN,
    "mlfq": MLFQ,
    "boost": Boost,
    "priority": Priority,
    "edf": EDF,
    "slack-countdown": SlackCountdown,
    "slack-mlfq": SlackMLFQ,
}


def make_policy(name: str, settings: Iterable[tuple[str, object]] = (),
                slos: Iterable[tuple[str, float]] = ()) -> Policy:
    """Policy ``name`` with its ``settings`` ((key, value) pairs, policies/settings.py) and, for one
    that schedules by SLOs, the run's ``slos`` ((metric, ms) pairs, ``--slo``). ValueError names
    the bad input."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (choose from {', '.join(POLICIES)})") from None
    kwargs = typed_settings(cls, settings)
    if cls.needs_slo:
        kwargs["slos"] = dict(slos)
    return cls(**kwargs)


__all__ = ["POLICIES", "Policy", "SchedulerView", "make_policy"]
