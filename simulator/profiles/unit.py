"""Every step takes exactly 1.0 s, prefill or not: for hand-checkable tests."""

from __future__ import annotations

from simulator.profiles.base import EngineProfile


class UnitProfile(EngineProfile):
    name = "unit"

    def step_time(self, prefill_tokens, prefill_sq, decode_batch, decode_context) -> float:
        return 1.0

    def compiled_coefficients(self):
        return "unit", (), ()
