"""Engine profiles, registered by CLI name. Adding one = one file + one line here."""

from __future__ import annotations

from collections.abc import Callable

from core.calibration_files import is_calibration_path
from core.hardware import A100_80GB, H100, H200, LLAMA3_8B, QWEN3_8B
from core.trace import Trace
from simulator.profiles.base import EngineProfile
from simulator.profiles.calibration import load_calibration
from simulator.profiles.fitted import FittedProfile
from simulator.profiles.roofline import RooflineProfile
from simulator.profiles.unit import UnitProfile

DEFAULT_PROFILE = "qwen3-8b-h100"


FITTED_FROM = "fitted:"   # `fitted:PATH`: fit on another trace's steps table (out of sample)


def _fitted(trace: Trace | None) -> EngineProfile:
    if trace is None or trace.steps is None:
        name = trace.name if trace is not None else "the trace"
        raise ValueError(f"engine 'fitted' needs a steps table beside {name} (NAME.steps.parquet); it has none")
    return FittedProfile.fit(trace.steps, source=trace.name,
                             note="in sample: fitted on the steps of the trace it replays")


def _fitted_from(spec: str) -> EngineProfile:
    """``fitted:PATH``: PATH is a trace (bundled name or .parquet), its NAME.steps.parquet, or a
    calibration (NAME.calibration.json or .parquet, ``leap-serve calibrate``)."""
    from core.trace import load_trace

    target = spec[len(FITTED_FROM):]
    if not target:
        raise ValueError("--engine fitted:PATH: PATH is empty")
    if is_calibration_path(target):   # a calibration grid (leap-serve calibrate), not a trace
        return load_calibration(target).profile()
    if target.endswith(".steps.parquet"):
        target = target[: -len(".steps.parquet")] + ".parquet"
    source = load_trace(target)
    if source.steps is None:
        raise ValueError(f"--engine {spec}: trace {source.name!r} has no steps table")
    return FittedProfile.fit(source.steps, source=source.name,
                             note=f"fitted on {source.name}'s steps (out of sample unless it is the replayed trace)")


def is_profile_name(name: str) -> bool:
    return name in PROFILES or name.startswith(FITTED_FROM)


PROFILES: dict[str, Callable[[Trace | None], EngineProfile]] = {
    "unit": lambda trace: UnitProfile(),
    "qwen3-8b-h100": lambda trace: RooflineProfile(QWEN3_8B, H100, name="qwen3-8b-h100"),
    "qwen3-8b-h200": lambda trace: RooflineProfile(QWEN3_8B, H200, name="qwen3-8b-h200"),
    "llama3-8b-a100": lambda trace: RooflineProfile(LLAMA3_8B, A100_80GB, name="llama3-8b-a100"),
    "fitted": _fitted,
}


def make_profile(name: str, trace: Trace | None = None) -> EngineProfile:
    if name.startswith(FITTED_FROM):
        return _fitted_from(name)
    try:
        factory = PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown engine profile {name!r} (choose from {', '.join(PROFILES)})") from None
    return factory(trace)


__all__ = ["DEFAULT_PROFILE", "FITTED_FROM", "PROFILES", "EngineProfile", "is_profile_name", "make_profile"]
