"""A policy's settings (``--setting POLICY.KEY=VALUE``, also in a run's ``config.json``): typed by
the policy's declared defaults (:attr:`policies.base.Policy.settings_defaults`) and checked here,
before any run, so that bad input is refused in one line naming the setting.

Every policy setting is a positive number (a rate, a quantum, a time per token, a count); an int
default takes only whole numbers. The policy's ``__init__`` takes the typed values as keywords.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def typed_settings(cls, given: Iterable[tuple[str, object]]) -> dict:
    """``given`` (key, value) pairs as ``cls``'s settings, typed; an unknown key, a value of the wrong
    type or one <= 0 raises ValueError naming ``--setting NAME.KEY=VALUE``."""
    out: dict = {}
    for key, value in given:
        where = f"--setting {cls.name}.{key}={value!r}"
        if key not in cls.settings_defaults:
            known = ", ".join(cls.settings_defaults) or "none"
            raise ValueError(f"{where}: policy {cls.name!r} has no setting {key!r} (its settings: {known})")
        kind = type(cls.settings_defaults[key])
        if isinstance(value, bool):
            raise ValueError(f"{where}: expected {'a whole number' if kind is int else 'a number'}")
        try:
            number = float(value)   # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected {'a whole number' if kind is int else 'a number'}") from None
        if not math.isfinite(number) or (kind is int and number != int(number)):
            raise ValueError(f"{where}: expected {'a whole number' if kind is int else 'a finite number'}")
        if number <= 0:
            raise ValueError(f"{where}: must be > 0")
        out[key] = int(number) if kind is int else number
    return out
