"""Rebuild what a recorded ``steps`` table lacks (decode context, prefill attention work, host gap).

The recorder (``capture/vllm_ext.py``) logged per engine step only counts: prefill requests and
tokens, decode requests and tokens. A step-time fit also needs the decoded requests' context length
(KV read per step) and the prefill attention work, and neither can be derived from counts alone.
Both follow exactly from the recording itself, without re-recording:

- A batch recording is a closed loop (``capture/backend_vllm.py``): the first ``window`` requests
  (``max_num_seqs + max(4, max_num_seqs // 8)``) are submitted in row order, and after every
  engine step one more is submitted per request that finished, so that ``window`` stay in flight.
- vLLM V1 schedules each step the running requests first (a decode takes 1 token of the
  ``max_num_batched_tokens`` budget, a partly prefilled prompt takes min(rest, budget left)), then
  waiting requests FCFS while fewer than ``max_num_seqs`` run and budget is left (chunked prefill:
  the last one admitted may get only part of its prompt). A request emits its first token in the
  step that completes its prompt and one token per later step; it finishes after its recorded
  ``output_tokens``.

Replaying that scheduler step by step with each request's prompt and output length gives every
step's composition; the replay is checked against the recorded counts step by step, and only steps
that match all four counts exactly are marked ``rebuilt_exact``. Added columns (the names the
recorder uses for new recordings):

- ``decode_context``: sum over the step's decoded requests of prompt + tokens generated before the
  step (the tokens whose keys and values the step reads).
- ``prefill_sq``: sum over the step's prefill chunks of chunk x (tokens computed before + chunk),
  the attention work of a chunk (a whole unchunked prompt of P tokens gives P x P, the engine's
  ``prefill_sq``).
- ``host_gap_s``: time from this step's end to the next step's start in the same run (the host's
  output processing and submission between steps); null for a run's last step.
- ``rebuilt_exact``: the replayed step matches all four recorded counts.

Each run is replayed twice, by the rule alone and with each step's admissions capped at the
recorded prefill count (a request submitted to a multiprocess engine, e.g. lmsys, reaches the
engine core a step or more late), and the replay matching more steps is kept.

Multi-run (resumed) recordings: run k's queue is every request not finished in an earlier run, in
row order; the requests a run finished are its first ``runs[k].requests`` finishers in the replay.
Requests that were in flight when a run was interrupted were generated again in a later run, with
a length that the trace does not record for the interrupted run; steps that this makes inexact are
flagged, not guessed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from core.io import atomic_write_parquet
from core.trace import METADATA_KEY, side_table_path

COUNT_COLUMNS = ("prefill_requests", "prefill_tokens", "decode_requests", "decode_tokens")
REBUILT_COLUMNS = ("decode_context", "prefill_sq", "host_gap_s", "rebuilt_exact")


@dataclass(frozen=True)
class VllmSettings:
    max_num_seqs: int
    max_num_batched_tokens: int
    window: int

    @classmethod
    def from_metadata(cls, meta: dict) -> VllmSettings:
        args = (meta.get("backend_details") or {}).get("engine_args") or {}
        seqs = int(args.get("max_num_seqs", 64))
        budget = int(args.get("max_num_batched_tokens", 2048))
        window = (meta.get("backend_details") or {}).get("window")
        return cls(seqs, budget, int(window) if window else seqs + max(4, seqs // 8))


def replay_run(prompt: np.ndarray, output: np.ndarray, queue: list[int], n_steps: int,
               settings: VllmSettings, recorded_prefills: np.ndarray | None = None
               ) -> tuple[dict[str, np.ndarray], list[int]]:
    """Replay ``n_steps`` engine steps of one closed-loop run; returns per-step columns and the
    rows in the order they finished.

    ``recorded_prefills`` (the recorded prefill_requests per step) caps how many waiting requests
    a step admits: a request submitted to a multiprocess engine reaches the engine core a step or
    more late, which the closed-loop rule alone cannot know; the cap never admits more than the
    scheduler rule allows, so a step whose counts match is still an exact reconstruction."""
    cols = {c: np.zeros(n_steps, dtype=np.int64) for c in (*COUNT_COLUMNS, "decode_context", "prefill_sq")}
    pending = deque(queue)
    waiting: deque[int] = deque()
    running: list[int] = []                       # admission order
    computed: dict[int, int] = {}                 # prompt tokens computed so far
    generated: dict[int, int] = {}
    in_flight = 0
    finished: list[int] = []

    def submit():
        nonlocal in_flight
        while pending and in_flight < settings.window:
            waiting.append(pending.popleft())
            in_flight += 1

    submit()
    for s in range(n_steps):
        budget = settings.max_num_batched_tokens
        emitted: list[int] = []
        for r in running:
            if budget <= 0:
                break
            rest = int(prompt[r]) - computed[r]
            if rest > 0:
                chunk = min(rest, budget)
                cols["prefill_requests"][s] += 1
                cols["prefill_tokens"][s] += chunk
                cols["prefill_sq"][s] += chunk * (computed[r] + chunk)
                computed[r] += chunk
                budget -= chunk
                if computed[r] == prompt[r]:
                    emitted.append(r)
            else:
                cols["decode_requests"][s] += 1
                cols["decode_tokens"][s] += 1
                cols["decode_context"][s] += int(prompt[r]) + generated[r]
                budget -= 1
                emitted.append(r)
        limit = len(waiting) if recorded_prefills is None else \
            max(int(recorded_prefills[s]) - int(cols["prefill_requests"][s]), 0)
        while waiting and budget > 0 and len(running) < settings.max_num_seqs and limit > 0:
            limit -= 1
            r = waiting.popleft()
            running.append(r)
            computed[r], generated[r] = 0, 0
            chunk = min(int(prompt[r]), budget)
            cols["prefill_requests"][s] += 1
            cols["prefill_tokens"][s] += chunk
            cols["prefill_sq"][s] += chunk * chunk
            computed[r] = chunk
            budget -= chunk
            if chunk == prompt[r]:
                emitted.append(r)
        done = []
        for r in emitted:
            generated[r] += 1
            if generated[r] >= output[r]:
                done.append(r)
        if done:
            gone = set(done)
            running = [r for r in running if r not in gone]
            finished.extend(sorted(done))
            in_flight -= len(done)
            submit()
    return cols, finished


def rebuild(trace_path: Path) -> tuple[pa.Table, dict]:
    """The trace's steps table with the rebuilt columns added, and a per-run match report."""
    requests = pq.read_table(trace_path, columns=["prompt_tokens", "output_tokens"])
    meta = json.loads((requests.schema.metadata or {}).get(METADATA_KEY, b"{}"))
    steps_path = side_table_path(trace_path, "steps")
    steps = pq.read_table(steps_path)
    settings = VllmSettings.from_metadata(meta)
    prompt = requests.column("prompt_tokens").to_numpy().astype(np.int64)
    output = requests.column("output_tokens").to_numpy().astype(np.int64)
    run = steps.column("run").to_numpy().astype(np.int64)
    run_step = steps.column("run_step").to_numpy().astype(np.int64)
    order = np.lexsort((run_step, run))
    if not np.array_equal(order, np.arange(len(order))):
        raise ValueError(f"{steps_path}: steps are not in (run, run_step) order")
    recorded = {c: steps.column(c).to_numpy().astype(np.int64) for c in COUNT_COLUMNS}
    n = steps.num_rows
    out = {c: np.zeros(n, dtype=np.int64) for c in ("decode_context", "prefill_sq")}
    exact = np.zeros(n, dtype=bool)
    finished_by_run = {int(r["run"]): int(r["requests"]) for r in meta.get("runs", []) if "run" in r}
    done = np.zeros(len(prompt), dtype=bool)
    report: dict[str, Any] = {"trace": trace_path.name, "runs": []}
    for k in np.unique(run):
        idx = np.flatnonzero(run == k)
        queue = [int(i) for i in np.flatnonzero(~done)]
        best: tuple[dict[str, np.ndarray], list[int], np.ndarray, bool] | None = None
        for cap in (None, recorded["prefill_requests"][idx]):   # keep the replay that matches more steps
            cols, finishers = replay_run(prompt, output, queue, len(idx), settings, cap)
            match = np.ones(len(idx), dtype=bool)
            for c in COUNT_COLUMNS:
                match &= cols[c] == recorded[c][idx]
            if best is None or match.sum() > best[2].sum():
                best = (cols, finishers, match, cap is not None)
        if best is None:   # the loop above ran twice
            raise RuntimeError("no replay of the run was made")
        cols, finishers, match, capped = best
        for c in out:
            out[c][idx] = cols[c]
        exact[idx] = match
        keep = finished_by_run.get(int(k), len(finishers))
        done[finishers[:keep]] = True
        report["runs"].append({"run": int(k), "steps": len(idx), "exact_steps": int(match.sum()),
                               "match_rate": float(match.mean()) if len(idx) else 1.0,
                               "finished_recorded": finished_by_run.get(int(k)),
                               "finished_replayed": len(finishers),
                               "admissions_capped_by_recording": capped})
    start = steps.column("wall_start_s").to_numpy().astype(np.float64)
    dur = steps.column("step_s").to_numpy().astype(np.float64)
    gap = np.full(n, np.nan)
    same_run = run[1:] == run[:-1]
    gap[:-1] = np.where(same_run, start[1:] - (start[:-1] + dur[:-1]), np.nan)
    table = steps
    for name, values, typ in (("decode_context", out["decode_context"], pa.int64()),
                              ("prefill_sq", out["prefill_sq"], pa.int64()),
                              ("host_gap_s", gap, pa.float64()),
                              ("rebuilt_exact", exact, pa.bool_())):
        array = pa.array(values, type=typ, from_pandas=True) if name == "host_gap_s" else pa.array(values, type=typ)
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, array)
        else:
            table = table.append_column(name, array)
    report["exact_steps"] = int(exact.sum())
    report["steps"] = n
    report["match_rate"] = float(exact.mean()) if n else 1.0
    meta_out = dict(table.schema.metadata or {})
    meta_out[b"leap.steps_rebuilt"] = json.dumps({
        "by": "experiments.steps_rebuild (closed-loop vLLM V1 scheduler replay)",
        "settings": settings.__dict__, "match_rate": report["match_rate"],
        "runs": report["runs"]}, sort_keys=True).encode()
    return table.replace_schema_metadata(meta_out), report


def rebuilt_path(trace_path: Path, replace: bool) -> Path:
    """Where the rebuilt steps table goes: a new file beside the recorded one, unless ``replace``."""
    steps = side_table_path(trace_path, "steps")
    return steps if replace else steps.with_name(steps.name.removesuffix(".parquet") + ".rebuilt.parquet")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rebuild-steps", description="Add decode_context, prefill_sq, "
                                "host_gap_s and rebuilt_exact to recorded steps tables (rerunnable).")
    p.add_argument("traces", nargs="+", type=Path, help="trace .parquet files (beside each, NAME.steps.parquet is "
                   "read and NAME.steps.rebuilt.parquet written)")
    p.add_argument("--check", action="store_true", help="report the match rate only; write nothing")
    p.add_argument("--replace", action="store_true", help="rewrite NAME.steps.parquet itself (the table that "
                   "profiles are fitted on) instead of writing NAME.steps.rebuilt.parquet")
    args = p.parse_args(argv)
    for path in args.traces:
        if not path.is_file() or not side_table_path(path, "steps").is_file():
            print(f"rebuild-steps: error: {path}: no such trace or no steps table beside it", file=sys.stderr)
            return 2
    for path in args.traces:
        try:
            table, report = rebuild(path)
        except (ValueError, KeyError, OSError, pa.ArrowException) as exc:
            print(f"rebuild-steps: error: {path}: {exc}", file=sys.stderr)
            return 2
        if not args.check:
            target = rebuilt_path(path, args.replace)
            atomic_write_parquet(target, table)
            report["written"] = target.name
        print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
