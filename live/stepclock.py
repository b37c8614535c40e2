"""leap-serve's arrival clocks: seconds (today's open loop) and engine steps (``--clock steps``).

Under the step clock (docs/semantics.md "Step clock") every request has an integer
``arrival_step`` and is submitted just before that engine step's scheduling decision; the run
records per request ``admit_step``, ``first_token_step`` and ``finish_step``. No decision depends
on how fast the host runs, so a step-clocked run and its simulation (``simulate --arrivals
steps``) can be compared request by request. Loads are multiples of the live capacity in requests
per step (all requests queued at step 0, completions per step over the saturated window), measured
by the same ``--capacity measure`` run as the capacity in requests per second.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from capture import CaptureError

CLOCKS = ("seconds", "steps")
STEP_TIMING = ("step clock: each request is submitted just before engine step arrival_step (steps "
               "are numbered from 0 and idle steps count; docs/semantics.md \"Step clock\"); "
               "admit_step, first_token_step and finish_step are the steps that first scheduled its "
               "prefill, emitted its first and its last token; arrival_s (actual submission offset), "
               "ttft_s, e2e_s and token_times_s are wall times on this host beside them, in eager mode")


def check_clock_flags(args) -> None:
    """Flags the step clock refuses, before any file is read or an engine starts."""
    if args.clock != "steps":
        return
    if args.rate is not None:
        raise CaptureError("--clock steps: --rate is in requests per second; give --load X (times the "
                           "live capacity in requests per step) or --arrivals FILE.csv of arrival_step")
    if args.executor != "uni":
        raise CaptureError("--clock steps reads admissions from the engine core's scheduler: it needs "
                           "--executor uni")
    if args.load is not None and args.arrivals not in (None, "poisson"):
        raise CaptureError(f"--clock steps --arrivals {args.arrivals}: the arrival steps are replayed as "
                           "given; omit --load")
    if args.resume:
        raise CaptureError("--clock steps --resume: a step-clocked run cannot be continued part-way (its step "
                           "numbering would restart); rerun it with --overwrite")
    if args.arrivals not in (None, "poisson") and Path(args.arrivals).is_file():
        from core.arrivals import read_steps_csv
        try:
            read_steps_csv(Path(args.arrivals))     # its rows checked before any file is loaded
        except ValueError as e:
            raise CaptureError(str(e)) from None


def capacity_of(entry: dict, clock: str) -> float:
    """The capacity a load multiplies: requests per second, or per step under the step clock."""
    if clock != "steps":
        return float(entry["capacity_req_s"])
    if "capacity_req_per_step" not in entry:
        raise CaptureError("--clock steps --load: the cached capacity of this workload and engine setting "
                           "has no capacity in requests per step; measure it again (--capacity measure)")
    return float(entry["capacity_req_per_step"])


def planned_arrivals(args, n: int, rate: float | None) -> tuple[np.ndarray, str]:
    """Arrivals of the n requests in submission order, and a description: offsets in seconds, or
    int64 step indices under the step clock. Poisson is the project's one generator
    (``core.arrivals.poisson_offsets``: same seed and rate -> the same arrivals as ``simulate``)."""
    from core.arrivals import poisson_offsets, poisson_steps, read_steps_csv, read_timestamps_csv, rescale_to_rate

    steps = args.clock == "steps"
    if args.arrivals == "poisson":
        assert rate is not None
        return (poisson_steps(n, rate, args.seed) if steps else poisson_offsets(n, rate, args.seed)), "poisson"
    path = Path(args.arrivals)
    try:
        times = read_steps_csv(path) if steps else read_timestamps_csv(path)
    except ValueError as e:
        raise CaptureError(str(e)) from None
    if rate is not None and not steps:
        return rescale_to_rate(times, n, rate), f"{path.name} (stretched to the rate)"
    if len(times) < n:
        unit = "arrival steps" if steps else "timestamps"
        hint = "" if steps else " (give --load or --rate to tile and stretch them)"
        raise CaptureError(f"--arrivals {path}: {len(times)} {unit} for {n} requests{hint}")
    return times[:n], f"{path.name} (as recorded)"


def rate_key(clock: str) -> str:
    """The run config's name for the arrival rate: per second, or per step under the step clock."""
    return "rate_req_per_step" if clock == "steps" else "rate_req_s"


def serving_fields(clock: str, capacity: float | None, rate: float | None) -> dict:
    """The serving metadata that names the clock and its units (``serving.clock`` etc.)."""
    if clock != "steps":
        return {"clock": "seconds"}
    return {"clock": "steps", "capacity_req_s": None, "rate_req_s": None,
            "capacity_req_per_step": capacity, "rate_req_per_step": rate}
