"""leap-serve calibrate: measure this host's step profile on a designed grid of
step shapes.

    leap-serve calibrate --threads 1 \\
        --out traces/live/calibration/today            # full grid, ~2-3 min
    leap-serve calibrate --threads 1 --check traces/live/calibration/today \\
        --out traces/live/calibration/RUN.check      # host-speed check, < 30 s
    simulate ... \\
        --engine fitted:traces/live/calibration/today.calibration.json
                                                       # profile fitted on it

Why: a profile fitted on a serving run's own steps only covers the shapes that
run produced (mostly full 16-decode steps at 1.3x) and carries that session's
host speed, so it extrapolates badly to other loads and cannot tell a slow host
from a wrong model. The calibration drives the same engine (vLLM CPU, the model
and engine settings of ``scripts/live_runs.sh``) through *cells*: a set of
synthetic requests (random token ids, forced lengths) submitted at given engine
steps, so each cell produces a known run of step shapes: decode batches
1..max_resident at short and long contexts, prefill chunks alone and beside
running decodes. Every step's time, composition and the drift probe are
recorded as a steps table (the ``fitted`` profile's columns plus
``host_gap_s``, ``cell``, ``cell_step``), with the engine settings and the
quiet probe in a JSON file beside it (``NAME.calibration.parquet`` +
``NAME.calibration.json``).

A *check* (``--check CALIBRATION``) runs a few cells of the same grid and
reports ``speed_vs_calibration``: the median over its steps of step time / the
calibration's time for the same cell step (same composition), a pure host-speed
ratio with no model in between.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from capture import CaptureError
from core.calibration_files import (
    CALIBRATION_SUFFIX,
    calibration_paths,
    read_calibration,
    speed_vs_calibration,
    write_calibration,
)
from core.errors import OneLineParser, run_command

#: Calibration output format version (``NAME.calibration.json`` ``schema_version``).
SCHEMA_VERSION = 1
#: Sampling of the live runs (the source traces' recorded sampling); lengths are forced.
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.1}


@dataclass(frozen=True)
class Cell:
    """Requests (prompt tokens, forced output length, engine step before which it is submitted)
    run together from an empty engine: a known sequence of step shapes."""

    name: str
    requests: tuple[tuple[int, int, int], ...]


def decode_cell(batch: int, prompt: int, length: int) -> Cell:
    """``batch`` requests at once: prefill chunks, then ``length - 1`` decode steps of ``batch``
    requests whose context grows from ``prompt`` to ``prompt + length``."""
    return Cell(f"decode-b{batch}-p{prompt}", tuple((prompt, length, 0) for _ in range(batch)))


def mixed_cell(batch: int, chunks: tuple[int, ...], every: int = 6) -> Cell:
    """``batch`` decoding requests with one prompt of each size in ``chunks`` arriving every
    ``every`` steps: prefill chunks beside a running decode batch."""
    length = every * (len(chunks) + 1) + 4
    arrivals = tuple((q, 2, every * (i + 1)) for i, q in enumerate(chunks))
    return Cell(f"mixed-b{batch}", tuple((32, length, 0) for _ in range(batch)) + arrivals)


def prefill_cell(prompt: int) -> Cell:
    """One prompt alone (split into budget-sized chunks beyond the token budget)."""
    return Cell(f"prefill-p{prompt}", ((prompt, 2, 0),))


def full_grid(max_resident: int) -> list[Cell]:
    """The calibration grid: decode batches 1..max_resident at short contexts (denser up to 16,
    the live runs' decode slots), a long-context row, mixed and prefill-only cells."""
    short = [b for b in (1, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 32, 48, 64) if b <= max_resident]
    long_ = [b for b in (1, 4, 8, 12, 16) if b <= max_resident]
    cells = [decode_cell(b, 32, 24) for b in short] + [decode_cell(b, 224, 24) for b in long_]
    cells += [mixed_cell(min(4, max_resident), (16, 48, 128, 320, 1024)),
              mixed_cell(min(16, max_resident), (16, 48, 128, 320, 1024))]
    cells += [prefill_cell(q) for q in (48, 320, 1024)]
    return cells


def check_grid(max_resident: int) -> list[Cell]:
    """The host-speed check: a few cells of the full grid, run the same way (< 30 s on one core)."""
    wanted = {"decode-b1-p32", "decode-b4-p32", "decode-b8-p32", "decode-b16-p32", "prefill-p320"}
    return [c for c in full_grid(max_resident) if c.name in wanted]


WARMUP = Cell("warmup", tuple((64, 8, 0) for _ in range(4)))


# --------------------------------------------------------------------------- engine


def calibrate_parser() -> argparse.ArgumentParser:
    from capture.model import DEFAULT_MODEL_DIR

    p = OneLineParser(prog="leap-serve calibrate", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="BASE",
                   help="writes BASE.calibration.parquet (steps) and BASE.calibration.json (metadata)")
    p.add_argument("--check", metavar="CALIBRATION",
                   help="run the short host-speed check against this calibration instead of the full grid")
    p.add_argument("--run", metavar="NAME", help="with --check: the serving run this check belongs to")
    p.add_argument("--model", default=str(DEFAULT_MODEL_DIR), help="local HF model directory")
    p.add_argument("--max-resident", type=int, default=64, help="vLLM max_num_seqs (largest decode batch)")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--kv-space-gib", type=int, default=4)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", default=None, metavar="CPUS", help="pin the engine to these CPUs, e.g. 1")
    p.add_argument("--probe-every", type=int, default=4, metavar="N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return p


def _engine(args, log):
    """The live runs' engine: vLLM's CPU build in this process, the live scheduler (FCFS, every
    resident decoding so that the grid reaches decode batch max_resident), eager, no capture layers."""
    from capture.backend_vllm import VLLMBackend
    from live.config import LiveSchedulerConfig

    live = LiveSchedulerConfig(policy="fcfs", predictor="none", max_resident=args.max_resident,
                               decode_slots=args.max_resident, wait_cap=128)
    return VLLMBackend(args.model, last_layers=[], decode_layers=[], decode_every=0, dtype=args.dtype,
                       seed=args.seed, max_model_len=args.max_model_len, max_num_seqs=args.max_resident,
                       max_num_batched_tokens=args.max_num_batched_tokens, kv_space_gib=args.kv_space_gib,
                       threads=args.threads, executor="uni", probe_every=args.probe_every,
                       engine_overrides=dict(live.to_engine_args()), log=log)


def run_cell(be, cell: Cell, vocab: int, rng: np.random.Generator) -> list[dict]:
    """Run one cell from an empty engine to its last finish; its steps, each tagged with the cell,
    its index within the cell and the host gap after it (NaN after the cell's last step)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    be.engine.collective_rpc("ct_fetch")   # drop whatever an earlier cell left
    pending = sorted(enumerate(cell.requests), key=lambda x: x[1][2])
    live: set[str] = set()
    step = 0
    while pending or live:
        while pending and pending[0][1][2] <= step:
            i, (prompt, length, _) = pending.pop(0)
            ids = rng.integers(100, vocab - 100, size=prompt).tolist()
            params = SamplingParams(max_tokens=length, min_tokens=length, ignore_eos=True,
                                    temperature=SAMPLING["temperature"], top_p=SAMPLING["top_p"],
                                    repetition_penalty=SAMPLING["repetition_penalty"],
                                    output_kind=RequestOutputKind.DELTA, detokenize=False)
            be.engine.add_request(f"{cell.name}-{i}", {"prompt_token_ids": ids}, params)
            live.add(f"{cell.name}-{i}")
        for out in be.engine.step():
            if out.finished:
                live.discard(out.request_id)
        step += 1
        if step > 100_000:
            raise RuntimeError(f"cell {cell.name}: no finish after 100000 steps")
    rows = be.engine.collective_rpc("ct_fetch")[0]["steps"]
    for k, r in enumerate(rows):
        r["cell"], r["cell_step"] = cell.name, k
        nxt = rows[k + 1]["wall_start_s"] if k + 1 < len(rows) else None
        r["host_gap_s"] = float("nan") if nxt is None else max(nxt - r["wall_start_s"] - r["step_s"], 0.0)
    return rows


def steps_table(rows: list[dict]):
    import pyarrow as pa

    ints = ("prefill_requests", "prefill_tokens", "decode_requests", "decode_tokens", "decode_context",
            "prefill_sq", "cell_step")
    cols = {"step_index": pa.array(range(len(rows)), pa.int64()), "run": pa.array([0] * len(rows), pa.int32())}
    for name in ints:
        cols[name] = pa.array([int(r[name]) for r in rows], pa.int64())
    for name in ("wall_start_s", "step_s", "host_gap_s", "kv_usage", "probe_s", "probe_mem_s"):
        cols[name] = pa.array([r.get(name) for r in rows], pa.float64())
    cols["cell"] = pa.array([r["cell"] for r in rows], pa.string())
    return pa.table(cols)


# --------------------------------------------------------------------------- main


def _engine_settings(args, model_dir) -> dict:
    from capture.backend_vllm import parse_cpu_list
    from capture.model import model_revision
    from live.serve import _vllm_version

    return {"model_revision": model_revision(model_dir), "dtype": args.dtype,
            "max_model_len": args.max_model_len, "max_resident": args.max_resident,
            "decode_slots": args.max_resident, "scheduler": "live (fcfs)",
            "max_num_batched_tokens": args.max_num_batched_tokens, "kv_space_gib": args.kv_space_gib,
            "executor": "uni", "threads": len(parse_cpu_list(args.threads)) if args.threads else None,
            "sampling": SAMPLING, "engine": _vllm_version()}


def calibrate_main(argv) -> int:
    args = calibrate_parser().parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    for name in ("max_resident", "max_num_batched_tokens", "max_model_len", "kv_space_gib"):
        if getattr(args, name) < 1:
            raise CaptureError(f"--{name.replace('_', '-')} must be >= 1")
    if args.probe_every < 0:
        raise CaptureError("--probe-every must be >= 0")
    if args.run and not args.check:
        raise CaptureError("--run names the serving run of a --check")
    reference = None   # (name, metadata path, steps, metadata) of the calibration a check runs against
    if args.check:
        try:
            reference = read_calibration(args.check)
        except (OSError, ValueError) as e:
            raise CaptureError(f"--check {args.check}: {e}") from None
    steps_path, meta_path = calibration_paths(args.out)
    if (steps_path.exists() or meta_path.exists()) and not args.overwrite:
        raise CaptureError(f"{meta_path} exists; use --overwrite")
    if args.threads:
        from capture.backend_vllm import parse_cpu_list
        parse_cpu_list(args.threads)
    from capture.model import check_model_dir, read_config

    model_dir = check_model_dir(args.model)
    args.model = str(model_dir)
    settings = _engine_settings(args, model_dir)
    if reference is not None:
        ref_engine = reference[3].get("engine", {})
        differ = [k for k in ("model_revision", "dtype", "max_resident", "max_num_batched_tokens", "threads")
                  if ref_engine.get(k) != settings[k]]
        if differ:
            raise CaptureError(f"--check {args.check}: calibrated with another {differ[0]} "
                               f"({ref_engine.get(differ[0])!r}, here {settings[differ[0]]!r})")
    cells = check_grid(args.max_resident) if reference is not None else full_grid(args.max_resident)
    vocab = int(read_config(model_dir)["vocab_size"])
    t0 = time.time()
    be = _engine(args, log)
    try:
        rng = np.random.default_rng(args.seed)
        run_cell(be, WARMUP, vocab, rng)
        quiet = be.engine.collective_rpc("ct_probe", args=(20, True))[0]
        rows: list[dict] = []
        for cell in cells:
            t = time.perf_counter()
            got = run_cell(be, cell, vocab, np.random.default_rng([args.seed, len(rows)]))
            rows += got
            log(f"{cell.name}: {len(got)} steps in {time.perf_counter() - t:.1f}s")
        after = be.engine.collective_rpc("ct_probe", args=(20, True))[0]
    finally:
        be.close()
    table = steps_table(rows)
    meta = {"schema_version": SCHEMA_VERSION, "kind": "check" if reference is not None else "calibration",
            "name": steps_path.name[: -len(CALIBRATION_SUFFIX + ".parquet")],
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "engine": settings, "grid": [c.name for c in cells], "steps": table.num_rows,
            "wall_s": time.time() - t0, "seed": args.seed,
            "probe": {"before_median_s": float(np.median(quiet["probe_s"])),
                      "before_mem_median_s": float(np.median(quiet["probe_mem_s"])),
                      "after_median_s": float(np.median(after["probe_s"])),
                      "after_mem_median_s": float(np.median(after["probe_mem_s"]))},
            "steps_sha256": None}
    if reference is not None:
        ref_name, _, ref_steps, ref_meta = reference
        meta["calibration"] = {"name": ref_name, "steps_sha256": ref_meta.get("steps_sha256")}
        meta["run"] = args.run
        meta["speed_vs_calibration"] = speed_vs_calibration(table, ref_steps)
    write_calibration(steps_path, meta_path, table, meta)
    summary = {k: meta[k] for k in ("kind", "name", "steps", "wall_s")}
    if reference is not None:
        summary["speed_vs_calibration"] = meta["speed_vs_calibration"]
    else:
        summary["profile"] = f"fitted:{meta_path}"   # simulate / leap-validate fit it from there
    print(json.dumps(summary))
    return 0


def main(argv=None) -> int:
    return run_command(calibrate_main, argv, "leap-serve calibrate")


if __name__ == "__main__":
    sys.exit(main())
