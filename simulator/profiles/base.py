"""The engine-profile interface: how long one engine step takes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

from core.hardware import DEFAULT_HARDWARE, Hardware


class EngineProfile(ABC):
    """Step time as a function of the step's composition (seconds).

    ``prefill_tokens``: prompt tokens prefilled this step; ``prefill_sq``: sum of squared prompt
    lengths (attention is quadratic in a prompt); ``decode_batch``: requests decoded this step;
    ``decode_context``: sum of their context lengths (prompt + generated), i.e. KV read per step.
    """

    name: str   # a class default; an instance may carry its own (the named roofline presets)

    @abstractmethod
    def step_time(self, prefill_tokens: int, prefill_sq: int, decode_batch: int, decode_context: int) -> float:
        ...

    @property
    def hardware(self) -> Hardware:
        """The (model, GPU) that predictor costs are charged on. Profiles that model no hardware
        (unit, fitted from recorded steps) use the default engine's, ``qwen3-8b-h100``."""
        return DEFAULT_HARDWARE

    def compiled_coefficients(self) -> tuple[Literal["unit", "fitted", "roofline"], tuple[int, ...],
                                             tuple[float, ...]] | None:
        """The step-time formula as the compiled kernel evaluates it: (form, integer coefficients,
        float coefficients), in the order that formula reads them. None: not compiled (the reference
        engine runs the profile)."""
        return None

    def describe(self) -> dict:
        return {"name": self.name}
