"""Waits that stretch with the machine's load: a start-up or probe timeout is a bound on a hang,
not a speed target, so on a machine busy with other work it grows instead of failing a healthy
run. ``scaled(seconds)`` is ``seconds`` times the load factor: the 1-minute load average per CPU,
at least 1 (an idle machine keeps the base). Measured when the wait starts."""

from __future__ import annotations

import os


def load_factor() -> float:
    """The 1-minute load average over the CPUs this process may use, at least 1."""
    try:
        load = os.getloadavg()[0]
    except OSError:   # not available on this platform: no stretching
        return 1.0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1.0, load / max(cpus, 1))


def scaled(seconds: float) -> float:
    """``seconds`` stretched by :func:`load_factor`."""
    return seconds * load_factor()
