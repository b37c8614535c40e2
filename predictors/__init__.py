"""Length predictors, registered by CLI name. Adding one = one file + one line here."""

from __future__ import annotations

from predictors.base import PendingUpdate, Predictor, PredictorCost, PredictorOptions
from predictors.egtp import EGTP
from predictors.heads import HeadPredictor
from predictors.leap import Leap, LeapRLS
from predictors.ltr import LTR
from predictors.noisy_oracle import NoisyOracle
from predictors.oracle import Oracle
from predictors.ssjf import SSJF
from predictors.tie import Tie
from predictors.trail import Trail

#: The name of running without a predictor (``simulate --predictor none``, a live run without one).
NO_PREDICTOR = "none"

PREDICTORS: dict[str, type[Predictor]] = {
    "oracle": Oracle,
    "noisy-oracle": NoisyOracle,
    "leap": Leap,
    "leap-rls": LeapRLS,
    "tie": Tie,
    "ssjf": SSJF,
    "ltr": LTR,
    "trail": Trail,
    "egtp": EGTP,
}


#: Derived from the registry (lists elsewhere, e.g. the report and scripts/train_baselines.py, use these):
#: the upper bounds that read the true lengths, the predictors that declare themselves learned, and the baselines
#: (text-encoder / hidden-state heads with shipped weights, trained by scripts/train_baselines.py).
ORACLES = tuple(n for n, c in PREDICTORS.items() if c.sees_true_lengths)
LEARNED = tuple(n for n, c in PREDICTORS.items() if c.learned)
BASELINES = tuple(n for n, c in PREDICTORS.items() if issubclass(c, HeadPredictor))


def make_predictor(name: str, options: PredictorOptions | None = None) -> Predictor:
    try:
        cls = PREDICTORS[name]
    except KeyError:
        raise ValueError(f"unknown predictor {name!r} (choose from {', '.join(PREDICTORS)})") from None
    return cls.from_options(options or PredictorOptions())


__all__ = ["BASELINES", "LEARNED", "NO_PREDICTOR", "ORACLES", "PREDICTORS", "PendingUpdate", "Predictor", "PredictorCost", "PredictorOptions", "make_predictor"]
