"""Length predictors, registered by CLI name. Adding one = one file + one line here."""

from __future__ import annotations

from predictors.base import PendingUpdate, Predictor, PredictorCost, PredictorOptions
from predictors.leap import Leap, LeapRLS
from predictors.noisy_oracle import NoisyOracle
from predictors.oracle import Oracle

PREDICTORS: dict[str, type[Predictor]] = {
    "oracle": Oracle,
    "noisy-oracle": NoisyOracle,
    "leap": Leap,
    "leap-rls": LeapRLS,
}


def make_predictor(name: str, options: PredictorOptions | None = None) -> Predictor:
    try:
        cls = PREDICTORS[name]
    except KeyError:
        raise ValueError(f"unknown predictor {name!r} (choose from {', '.join(PREDICTORS)})") from None
    return cls.from_options(options or PredictorOptions())


__all__ = ["PREDICTORS", "PendingUpdate", "Predictor", "PredictorCost", "PredictorOptions", "make_predictor"]
