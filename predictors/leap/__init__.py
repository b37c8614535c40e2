"""LEAP: a linear read-out of the serving model's hidden state, optionally corrected online by RLS.

Read-out (predictor ``leap``, :mod:`predictors.leap.frozen`)
-----------------------------------------------------------
The frozen ridge read-out of :mod:`core.readout` (standardise, ridge on ``sqrt(output_tokens)``
with lambda by 5-fold CV on the training trace, clip, square; cached under ``cache_dir()/leap/``),
scored on the CPU once prefill has tapped the layer; optionally refreshed from decode-time states
(:mod:`predictors.leap.refresh`).

Online correction (predictor ``leap-rls``, :mod:`predictors.leap.online`)
------------------------------------------------------------------------
Anchored RLS (:mod:`predictors.leap.rls`) from the ridge weights, fed by finished requests on the
engine's CPU worker. Cost model constants: :mod:`predictors.leap.cost`.
"""

from predictors.leap.cost import (
                                  PREDICT_FIXED_S,
                                  PREDICT_S_PER_DIM,
                                  REFRESH_GPU_S,
                                  RLS_FIXED_S,
                                  RLS_S_PER_BD2,
                                  prediction_cpu_s,
                                  rls_update_cpu_s,
                                  tap_fraction,
)
from predictors.leap.frozen import Leap
from predictors.leap.online import LeapRLS
from predictors.leap.refresh import fit_decode_readout
from predictors.leap.rls import AnchoredRLS

__all__ = ["PREDICT_FIXED_S", "PREDICT_S_PER_DIM", "REFRESH_GPU_S", "RLS_FIXED_S", "RLS_S_PER_BD2", "AnchoredRLS",
           "Leap", "LeapRLS", "fit_decode_readout", "prediction_cpu_s", "rls_update_cpu_s", "tap_fraction"]
