"""LEAP's estimate scored as llm-d's output-length bins: SHORT and LONG precision and recall.

llm-d's rule classifier (router PR #2309) puts a request in LONG (4,096 tokens), UNKNOWN (1,000)
or SHORT (100) from ``enable_thinking``, ``thinking_budget`` and ``has_tools``. Here the same two
outer bins are read off each request's first estimate (the one a router would get after prefill)
and scored against the true output length:

- SHORT: length <= ``--short-at`` (100 tokens, as llm-d's);
- LONG: length >= ``--long-fraction`` x the request's ``max_tokens``. llm-d's 4,096 is an absolute
  count for models served with a far larger output cap than the bundled traces' 1,024; scaled as
  the same fraction of the cap, 4,096 is 0.5 of an 8,192-token cap (the default: LONG >= 512 at
  1,024) and 0.125 of a 32,768-token cap (LONG >= 128).

Precision = requests put in the bin whose true length is in it / requests put in it (nan when none
is); recall = / requests whose true length is in it. Estimates stream in trace order
(``predictors.evaluate.stream_predictions``: leap-rls learns online from finished requests).

    python -m experiments.length_bins --trace lmsys --trace math --long-fraction 0.5

Bad input (unknown predictor or trace, a threshold out of range) is one line on stderr, exit 2.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np

from core.checks import split_list
from core.errors import OneLineParser, UsageError, run_command
from core.trace import Trace, TraceError, bundled_trace_names, load_trace
from predictors import PREDICTORS, make_predictor
from predictors.base import PredictorOptions
from predictors.evaluate import stream_predictions

PROG = "length-bins"
SHORT_AT = 100
LONG_FRACTION = 0.5


def bin_scores(estimate: np.ndarray, true: np.ndarray, short_at: float, long_at: np.ndarray) -> dict:
    """Precision and recall of the SHORT (<= short_at) and LONG (>= long_at, per request) bins."""
    estimate, true = np.asarray(estimate, dtype=np.float64), np.asarray(true, dtype=np.float64)
    out: dict = {"n": int(len(true))}
    for name, said, real in (("short", estimate <= short_at, true <= short_at),
                             ("long", estimate >= long_at, true >= long_at)):
        hit = int(np.sum(said & real))
        n_said, n_real = int(said.sum()), int(real.sum())
        out[f"{name}_true"], out[f"{name}_said"] = n_real, n_said
        out[f"{name}_precision"] = hit / n_said if n_said else math.nan
        out[f"{name}_recall"] = hit / n_real if n_real else math.nan
    return out


def score(predictor: str, trace: Trace, options: PredictorOptions, short_at: float, long_fraction: float) -> dict:
    estimate, _ = stream_predictions(make_predictor(predictor, options), trace, options.seed)
    long_at = long_fraction * trace.max_tokens.astype(np.float64)
    row = {"predictor": predictor, "trace": trace.name, "short_at": short_at,
           "long_at": float(np.median(long_at))}
    row.update(bin_scores(estimate, trace.output_tokens, short_at, long_at))
    return row


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description="SHORT/LONG bin precision and recall of length estimates.")
    p.add_argument("--trace", action="append", metavar="TRACE",
                   help="bundled name or path (repeatable; default: every bundled trace with feat_last)")
    p.add_argument("--predictor", default="leap,leap-rls", help="comma list (default leap,leap-rls)")
    p.add_argument("--train-trace", default="lmsys", help="training trace of the read-out (default lmsys)")
    p.add_argument("--short-at", type=float, default=SHORT_AT, help="SHORT: length <= this (default 100)")
    p.add_argument("--long-fraction", type=float, default=LONG_FRACTION,
                   help="LONG: length >= this fraction of max_tokens (default 0.5: 4,096 of 8,192)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    return p


def _traces(specs: list[str] | None) -> list[Trace]:
    if specs:
        return [load_trace(s) for spec in specs for s in split_list("--trace", spec)]
    return [t for t in (load_trace(s) for s in bundled_trace_names()) if t.has_feature("feat_last")]


def run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    names = split_list("--predictor", args.predictor)
    for name in names:
        if name not in PREDICTORS:
            raise UsageError(f"--predictor: unknown predictor {name!r} (choose from {', '.join(PREDICTORS)})")
    if not args.short_at > 0:
        raise UsageError(f"--short-at must be > 0 (got {args.short_at:g})")
    if not 0 < args.long_fraction <= 1:
        raise UsageError(f"--long-fraction must be in (0, 1] (got {args.long_fraction:g})")
    traces = _traces(args.trace)
    options = PredictorOptions(train_trace=args.train_trace, seed=args.seed)
    rows = [score(n, t, options, args.short_at, args.long_fraction) for n in names for t in traces]
    for row in rows:
        if args.json:
            print(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}))
        else:
            print(f"{row['predictor']:9s} {row['trace']:13s} n={row['n']:5d}  SHORT<={row['short_at']:g}: "
                  f"P {row['short_precision']:.3f} R {row['short_recall']:.3f} ({row['short_true']} true)  "
                  f"LONG>={row['long_at']:g}: P {row['long_precision']:.3f} R {row['long_recall']:.3f} "
                  f"({row['long_true']} true)")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(run, argv, PROG, input_errors=(TraceError, ValueError))


if __name__ == "__main__":
    sys.exit(main())
