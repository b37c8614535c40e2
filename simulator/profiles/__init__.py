"""Engine profiles, registered by CLI name. Adding one = one file + one line here."""

from __future__ import annotations

from typing import Callable

from simulator.profiles.base import EngineProfile
from simulator.profiles.fitted import FittedProfile
from simulator.profiles.roofline import A100_80GB, H100, H200, LLAMA3_8B, QWEN3_8B, RooflineProfile
from simulator.profiles.unit import UnitProfile
from simulator.trace import Trace

DEFAULT_PROFILE = "qwen3-8b-h100"


def _fitted(trace: Trace | None) -> EngineProfile:
    if trace is None or trace.steps is None:
        name = trace.name if trace is not None else "the trace"
        raise ValueError(f"engine 'fitted' needs a steps table beside {name} (NAME.steps.parquet); it has none")
    return FittedProfile.fit(trace.steps, source=trace.name)


PROFILES: dict[str, Callable[[Trace | None], EngineProfile]] = {
    "unit": lambda trace: UnitProfile(),
    "qwen3-8b-h100": lambda trace: RooflineProfile(QWEN3_8B, H100, name="qwen3-8b-h100"),
    "qwen3-8b-h200": lambda trace: RooflineProfile(QWEN3_8B, H200, name="qwen3-8b-h200"),
    "llama3-8b-a100": lambda trace: RooflineProfile(LLAMA3_8B, A100_80GB, name="llama3-8b-a100"),
    "fitted": _fitted,
}


def make_profile(name: str, trace: Trace | None = None) -> EngineProfile:
    try:
        factory = PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown engine profile {name!r} (choose from {', '.join(PROFILES)})") from None
    return factory(trace)


__all__ = ["DEFAULT_PROFILE", "PROFILES", "EngineProfile", "make_profile"]
