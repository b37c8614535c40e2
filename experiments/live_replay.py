"""What a replay takes from the live run it replays, for both validations (the wall-clock one,
:mod:`experiments.validate_serving`, and the step-clocked one, :mod:`experiments.validate_steps`):
the simulator's twin of the live predictor, the online-update batch, the LEAP read-out the run used,
and the check that the simulator orders admission as the live run did."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from core.trace import Trace
from predictors.live import LIVE_PREDICTORS
from simulator.serving import serving_meta

#: simulator predictors fitted on the training trace of the live run's read-out
READOUT_PREDICTORS = ("leap", "leap-rls")


def simulator_twin(trace: Trace, replayable=None, what: str = "simulator counterpart") -> tuple[str, str]:
    """(live predictor, its simulator twin: :data:`predictors.live.LIVE_PREDICTORS`) of a serving run;
    ValueError naming the run when the live predictor is not among ``replayable`` (default: every
    live predictor)."""
    live_pred = str(serving_meta(trace).get("predictor", "none"))
    known = list(LIVE_PREDICTORS if replayable is None else replayable)
    if live_pred not in known:
        raise ValueError(f"trace {trace.name!r}: live predictor {live_pred!r} has no {what} ({', '.join(known)})")
    return live_pred, LIVE_PREDICTORS[live_pred].twin


def update_every(trace: Trace) -> int:
    """The live run's online-update batch (leap-rls; 8, the live default, when not recorded)."""
    live_cfg = (((trace.metadata or {}).get("backend_details") or {}).get("engine_args") or {}) \
        .get("additional_config", {}).get("leap_live", {})
    return int(live_cfg.get("update_every") or 8)


def readout_file(trace: Trace) -> tuple[Path | None, str]:
    """(the LEAP read-out file the run used, or None, and why not): ``serving.readout`` =
    ``FILE@sha256:DIGEST``, the file beside the run or in the folder above it (a set of repeats
    in a subfolder shares one read-out), checked by hash."""
    ref = serving_meta(trace).get("readout")
    if not ref:
        return None, "no read-out named in the serving metadata"
    fname, _, digest = str(ref).partition("@sha256:")
    here = trace.path.parent if trace.path is not None else None
    path = next((p for p in ((here / fname), (here.parent / fname)) if p.is_file()), None) if here else None
    if path is None:
        return None, f"read-out {fname} not found beside the trace or in the folder above it"
    if not digest or hashlib.sha256(path.read_bytes()).hexdigest()[:len(digest)] != digest:
        return None, f"read-out {fname} beside the trace is not the one the run used (hash)"
    return path, ""


def readout_contents(path: Path) -> tuple[dict, np.ndarray]:
    """(info, weights) of a read-out file."""
    with np.load(path, allow_pickle=False) as data:
        return json.loads(str(data["info"])), np.array(data["theta"], dtype=np.float64)


def check_admission_order(trace: Trace, sim_orders: bool, replay: str) -> None:
    """ValueError naming the run when the live run ordered admission by the policy's keys and the
    simulator's ``replay`` would not, or the other way round: such a run cannot be replayed as it ran."""
    live_orders = bool(serving_meta(trace).get("ordered_admission", False))
    if live_orders != sim_orders:
        raise ValueError(f"trace {trace.name!r}: the live run {'ordered' if live_orders else 'did not order'} "
                         f"admission, the simulator {'does' if sim_orders else 'does not'} for {replay}; "
                         "not replayable as it ran")
