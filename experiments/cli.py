"""``simulate``: replay a trace under a length-aware scheduler and report latency.

Examples::

    simulate --load 1.5x --predictor leap-rls
    simulate --trace sharegpt --policy fcfs,countdown --predictor oracle --load 1x,1.5x --json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import signal
import sys
from pathlib import Path

from core.arrivals import parse_load
from core.checks import bounded_int, check_decode_slots, output_path, own_requests_arrivals, split_list
from core.errors import OneLineParser, UsageError, run_command
from core.io import remove_stale_temps
from core.trace import TraceError, bundled_trace_names, load_trace
from experiments.field_metrics import add_field_metric_flags, save_result, with_goodput
from experiments.pd_flags import add_pd_flags, check_find_max_rate, with_pd
from experiments.policy_options import check_policies, expand_policies, split_settings
from experiments.sweep import (
    Stopped,
    SweepInterrupted,
    add_relative_changes,
    run_many,
    run_slug,
    sigterm_raises_stopped,
    write_results,
)
from experiments.table import load_text, print_table
from policies import POLICIES
from predictors import PREDICTORS
from predictors.base import PredictorOptions
from routers import DECODE_ROUTERS, DEFAULT_ROUTER, MAX_REPLICAS, ROUTERS, check_router_cache, serves
from simulator.compiled import DEFAULT_KERNEL, KERNELS, NOTED_ENV, note_fallback, unsupported
from simulator.config import KV_BLOCKS_FROM_PROFILE, MAX_TOKEN_BUDGET
from simulator.engine import EngineConfig, Simulation
from simulator.kernel import announce_compile
from simulator.profiles import DEFAULT_PROFILE, PROFILES, is_profile_name
from simulator.runner import MAX_SEED, NO_PREDICTOR, PRESETS, RunConfig, code_hash, config_from_record, prepare
from simulator.workload import ArrivalSpec

PROG = "simulate"
DEFAULT_LOAD = "1x"
# flag -> EngineConfig field; an explicit flag overrides the same setting of a --preset
ENGINE_FLAGS = {"max_resident": "max_resident", "decode_slots": "decode_slots",
                "prefill_budget": "prefill_token_budget", "kv_budget": "kv_token_budget", "wait_cap": "wait_cap",
                "chunked_prefill": "chunked_prefill", "decodes_in_budget": "decodes_in_budget",
                "kv_blocks": "kv_blocks", "block_size": "kv_block_size", "prefix_caching": "prefix_caching"}
DEFAULT_TRACES = ("sharegpt", "sharegpt-lengths")
DEFAULT_PREDICTOR = "leap-rls"
# `--predictor all`: FCFS without a predictor, then every registered predictor but the noisy oracle
ALL_PREDICTORS = [NO_PREDICTOR] + [p for p in PREDICTORS if p != "noisy-oracle"]


#: Most runs one command plans (seeds x loads x predictors x policies), and most requests one
#: replay holds after --tile (about 1.5 KiB each: 100,000 tiled requests peaked at 145 MiB).
MAX_RUNS, MAX_TILE = 10_000, 2_000_000


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value < 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


def _kv_blocks(text: str) -> int | str:
    return KV_BLOCKS_FROM_PROFILE if text == KV_BLOCKS_FROM_PROFILE else bounded_int(1)(text)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description="Replay a recorded LLM serving trace under a length-aware scheduler.")
    p.add_argument("--trace", help="bundled trace name, path to a trace .parquet, or a public lengths-only "
                   "trace (Azure LLM inference .csv, Mooncake .jsonl, a .csv/.parquet of prompt and output token "
                   f"counts) (default: {DEFAULT_TRACES[0]}, else {DEFAULT_TRACES[1]})")
    p.add_argument("--predictor", help=f"comma list of {', '.join([*PREDICTORS, NO_PREDICTOR])}, or 'all' "
                   f"(default: FCFS and {DEFAULT_PREDICTOR} when the trace has hidden-state features, else FCFS and oracle)")
    p.add_argument("--policy", help=f"comma list of {', '.join(POLICIES)} (default: countdown, or fcfs "
                   "with --predictor none)")
    p.add_argument("--engine", default=None, help=f"step-time profile: {', '.join(PROFILES)}, or fitted:TRACE (fit on another "
                   f"trace's steps table: out of sample) (default {DEFAULT_PROFILE}; unit with --arrivals steps)")
    p.add_argument("--load", default=None, help="comma list of multiples of FCFS capacity, e.g. 0.5x,1x,1.5x "
                   f"(default {DEFAULT_LOAD}; not with --arrivals recorded/closed)")
    p.add_argument("--arrivals", default="poisson", help="poisson | trace | FILE.csv of timestamps (rescaled to the load's "
                   "mean rate) | FILE.jsonl (Mooncake: --trace FILE --arrivals trace) | recorded (each request at "
                   "its own arrival_s, unscaled) | closed:N (N in flight; 'closed': the recording's own window) | "
                   "steps (a step-clocked run: each request at its arrival_step, every step 1.0, no predictor cost)")
    p.add_argument("--preset", choices=PRESETS, help="recorded: the engine settings of the trace's own vLLM "
                   "recording (caps, token budget, chunked prefill, decodes in the budget); explicit engine "
                   "flags override single settings")
    p.add_argument("--requests", type=bounded_int(1), help="use the first N requests of the trace")
    p.add_argument("--tile", type=bounded_int(1, MAX_TILE, "requests one replay holds in memory"),
                   help="repeat the trace to N requests first (whole copies in "
                   "trace order, arrival gaps repeated, ids suffixed #COPY), for scaling studies")
    p.add_argument("--seed", type=bounded_int(0), default=0, help="first seed")
    p.add_argument("--kernel", choices=KERNELS, default=DEFAULT_KERNEL,
                   help="engine implementation: the compiled step (default; numba, same bytes; without numba, "
                        "or for a configuration it does not cover, it says so and uses the reference), or "
                        "the reference SimPy step loop that defines it")
    p.add_argument("--seeds", type=bounded_int(1, MAX_RUNS, "runs one command plans"), default=1,
                   help="run seeds seed .. seed+N-1")
    p.add_argument("--jobs", type=bounded_int(1), default=None,
                   help="worker processes for several runs (default: number of CPUs)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local worker processes, or a Ray cluster ($RAY_ADDRESS, else a local Ray)")
    # engine flags default to None so that an explicit one can override a --preset (defaults: EngineConfig)
    p.add_argument("--max-resident", type=bounded_int(1), help="default 512")
    p.add_argument("--decode-slots", type=bounded_int(1), help="default 64")
    p.add_argument("--prefill-budget", type=bounded_int(1),
                   help="prompt tokens prefilled per step (default 8192)")
    p.add_argument("--kv-budget", type=bounded_int(1),
                   help="optional KV-token admission limit (off by default)")
    p.add_argument("--kv-blocks", type=_kv_blocks,
                   help="KV cache of N blocks, or 'profile' (the blocks the engine profile's GPU memory holds "
                        "beside the weights): admission by blocks, preemption by recompute when a decode finds "
                        "none free (default: unbounded)")
    p.add_argument("--block-size", type=bounded_int(1, MAX_TOKEN_BUDGET), help="tokens per KV block (default 16)")
    p.add_argument("--prefix-caching", type=_on_off,
                   help="on|off: cache full KV blocks by prefix, vLLM V1's (default on wherever --kv-blocks is "
                        "given, as vLLM; docs/semantics.md 'Prefix caching')")
    p.add_argument("--wait-cap", type=bounded_int(0),
                   help="force a resident request after this many steps without a decode (0 = off; default 128)")
    p.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="prefill a prompt longer than the budget left in chunks, vLLM V1 style (default off)")
    p.add_argument("--decodes-in-budget", action=argparse.BooleanOptionalAction, default=None,
                   help="each decode takes one token of --prefill-budget first, vLLM V1 style (default off)")
    p.add_argument("--replicas", type=bounded_int(1, MAX_REPLICAS, "replicas one fleet simulates"), default=1,
                   help="engine replicas behind a router, one clock (default 1: the single engine)")
    p.add_argument("--router", default=DEFAULT_ROUTER, help=f"how a fleet routes each arrival: comma list of "
                   f"{', '.join(ROUTERS)}, or 'all' (default {DEFAULT_ROUTER}; least-work needs a predictor that "
                   "can serve it: 'all' leaves it out for one that cannot)")
    p.add_argument("--noise-mae", type=_float, default=0.0, help="noisy-oracle mean absolute error (tokens)")
    p.add_argument("--train-trace", default="lmsys", help="training trace for learned predictors")
    p.add_argument("--refresh", choices=("default", "on", "off"), default="default",
                   help="decode-time re-prediction for predictors that support it (TRAIL; LEAP on traces "
                        "with decode features)")
    p.add_argument("--predictor-cost", choices=("charged", "none"), default=None,
                   help="charge predictor GPU/CPU time to the engine, or not (paper's Table 4) (default charged; "
                        "none with --arrivals steps)")
    p.add_argument("--setting", action="append", default=[], metavar="NAME.KEY=VALUE",
                   help="a predictor's or policy's own setting, e.g. leap.alpha=0.001, tie.queue_batch=32, "
                        "ssjf.retrain=true, boost.gamma=0.05, mlfq.quantum=16 "
                        "(repeatable; unknown settings are refused, naming the known ones)")
    p.add_argument("--config", type=Path, help="rerun exactly the run a config.json describes (written by --out); "
                   "only output flags (--out, --json, --wide, --quiet, --plots) may be given with it")
    p.add_argument("--out", type=output_path, help="write requests.parquet, summary.json, config.json here")
    p.add_argument("--plots", action="store_true", help="write PNG figures next to the results table (needs --out)")
    p.add_argument("--json", action="store_true", help="print each run's summary as one JSON line")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--wide", action="store_true", help="table with every figure, however wide (default: compact, "
                   "fitted to the terminal by dropping columns, never cutting a value)")
    add_field_metric_flags(p)
    add_pd_flags(p)
    return p


#: Flags that --config leaves free (where results go and how they are shown).
OUTPUT_FLAGS = ("config", "out", "plots", "json", "quiet", "wide", "jobs", "executor", "kernel", "goodput",
                "save_result")


def _settings(items: list[str], predictors: list[str]) -> dict:
    """``--setting NAME.KEY=VALUE`` entries as {predictor: {key: value}} (values typed by the predictor)."""
    settings: dict = {}
    for item in items:
        name_key, sep, value = item.partition("=")
        name, dot, key = name_key.strip().partition(".")
        if not sep or not dot or not name or not key:
            raise UsageError(f"--setting {item!r}: expected PREDICTOR.KEY=VALUE, e.g. leap.alpha=0.001")
        if name not in PREDICTORS:
            raise UsageError(f"--setting {item!r}: unknown predictor {name!r} (choose from {', '.join(PREDICTORS)})")
        if name not in predictors:
            raise UsageError(f"--setting {item!r}: predictor {name!r} is not among those run ({', '.join(predictors)})")
        settings.setdefault(name, {})[key] = value.strip()
    for name, given in settings.items():   # unknown keys and bad values, before anything runs
        try:
            PREDICTORS[name].settings(PredictorOptions(settings={name: given}))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return settings


def _config_file_run(args) -> list[RunConfig]:
    """``--config FILE``: the one run a config.json describes, nothing else changed."""
    defaults = build_parser().parse_args([])
    changed = [f"--{k.replace('_', '-')}" for k, v in vars(args).items()
               if k not in OUTPUT_FLAGS and v != getattr(defaults, k)]
    if changed:
        raise UsageError(f"--config reruns a stored run as it was: drop {', '.join(changed)}")
    try:
        record = json.loads(args.config.read_text())
    except OSError as exc:
        raise UsageError(f"--config {args.config}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise UsageError(f"--config {args.config}: not JSON ({exc})") from None
    try:
        config = config_from_record(record)
    except (ValueError, TraceError) as exc:
        raise UsageError(f"--config {args.config}: {exc}") from None
    written_by = record.get("code_hash")
    if written_by is not None and written_by != code_hash():   # accepted: rerunning on newer code is a use
        print(f"{PROG}: note: --config {args.config} was written by other code (code hash {str(written_by)[:12]}, "
              f"now {code_hash()[:12]}): the rerun's figures may differ", file=sys.stderr)
    return [config]


def _configs(args) -> list[RunConfig]:
    if args.config is not None:
        return _config_file_run(args)
    if args.seed + args.seeds - 1 > MAX_SEED:   # results tables store seeds as int64
        raise UsageError(f"--seed {args.seed} --seeds {args.seeds}: seeds must stay below 2**63 "
                         f"(the last would be {args.seed + args.seeds - 1})")
    args.trace, args.arrivals = own_requests_arrivals(args.trace, args.arrivals)
    trace_name = args.trace
    if trace_name is None:   # the recorded serving trace once it is complete, else the lengths-only one
        names = bundled_trace_names()
        trace_name = next((t for t in DEFAULT_TRACES if t in names
                           and load_trace(t).complete), None)
        if trace_name is None:
            raise UsageError(f"no bundled default trace ({' or '.join(DEFAULT_TRACES)}) in traces/; pass --trace")
    if args.predictor is None:
        trace = load_trace(trace_name)
        predictors = [NO_PREDICTOR, DEFAULT_PREDICTOR if trace.has_feature("feat_last") and DEFAULT_PREDICTOR in
                      PREDICTORS else "oracle"]   # FCFS beside the length-aware run, for comparison
    else:
        predictors = []
        for name in split_list("--predictor", args.predictor):
            predictors += ALL_PREDICTORS if name == "all" else [name]
        predictors = list(dict.fromkeys(predictors))
    for name in predictors:
        if name != NO_PREDICTOR and name not in PREDICTORS:
            raise UsageError(f"unknown predictor {name!r} (choose from {', '.join([*PREDICTORS, NO_PREDICTOR])})")
    _check_lengths_only(trace_name, predictors)
    policy_names = list(split_list("--policy", args.policy)) if args.policy is not None else []
    # None: FCFS without a predictor, countdown with one; all: every one
    policies = expand_policies(policy_names, args.goodput is not None) if policy_names else [None]
    for policy_name in policies:
        if policy_name is not None and policy_name not in POLICIES:
            raise UsageError(f"unknown policy {policy_name!r} (choose from {', '.join(POLICIES)})")
    routers = _routers(args)
    named = set(split_list("--router", args.router))   # named routers are refused, not left out, when unserved
    step_clock = args.arrivals == "steps"   # the step clock's defaults: unit-time steps, nothing charged
    engine = args.engine if args.engine is not None else ("unit" if step_clock else DEFAULT_PROFILE)
    predictor_cost = args.predictor_cost if args.predictor_cost is not None else ("none" if step_clock else "charged")
    if not is_profile_name(engine):
        raise UsageError(f"unknown engine profile {engine!r} (choose from {', '.join(PROFILES)}, fitted:TRACE)")
    try:
        arrivals = ArrivalSpec.parse(args.arrivals)
        if arrivals.as_recorded:   # replayed as recorded: nothing to scale, no capacity to measure
            if args.load is not None:
                raise UsageError(f"--load does not apply to --arrivals {args.arrivals} (requests replay as "
                                 "recorded; no capacity is measured); drop --load")
            loads: list[float | None] = [None]
        else:
            loads = [parse_load(x) for x in split_list("--load", args.load if args.load is not None else DEFAULT_LOAD)]
        explicit = {field: getattr(args, flag) for flag, field in ENGINE_FLAGS.items() if getattr(args, flag) is not None}
        if args.block_size is not None and args.kv_blocks is None:   # as leap-serve's --kv-block-size
            raise UsageError(f"--block-size {args.block_size} applies with --kv-blocks only (KV is unbounded "
                             "without it); add --kv-blocks N or profile, or drop --block-size")
        if not args.preset and ("decode_slots" in explicit or "max_resident" in explicit):
            given = EngineConfig(**explicit)   # the defaults count: --decode-slots 600 is above 512
            check_decode_slots(given.decode_slots, given.max_resident)
        predictor_items, policy_options = split_settings(args.setting)
        runs = len(loads) * len(predictors) * len(policies) * len(routers) * args.seeds
        if runs > MAX_RUNS:
            raise UsageError(f"{runs:,} runs planned (--seeds x --load x --predictor x --policy x --router); "
                             f"at most {MAX_RUNS:,}")
        if args.preset:   # the preset is read from the trace; the combination is checked in prepare()
            engine_config, overrides = EngineConfig(), tuple(sorted(explicit.items()))
        else:
            engine_config, overrides = EngineConfig(**explicit), ()
        options = PredictorOptions(train_trace=args.train_trace, noise_mae=args.noise_mae, seed=args.seed,
                                   refresh={"default": None, "on": True, "off": False}[args.refresh],
                                   settings=_settings(predictor_items, predictors))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    configs, planned = [], set()
    seeds = range(args.seed, args.seed + args.seeds)
    for seed, load, predictor, policy, router in itertools.product(seeds, loads, predictors, policies, routers):
        if router not in named and (not serves(router, PREDICTORS.get(predictor))
                                    or not has_what_it_reads(router, engine_config)):
            continue   # 'all': the routers this predictor and this engine can serve
        if policy is None:   # default: FCFS without a predictor, countdown with one
            policy = "fcfs" if predictor == NO_PREDICTOR else "countdown"
        if predictor == NO_PREDICTOR and POLICIES[policy].uses_predictions:
            if len(predictors) == 1 and "all" not in split_list("--policy", args.policy or ""):
                raise UsageError(f"policy {policy!r} needs a predictor; use --predictor or --policy fcfs")
            policy = "fcfs"   # beside predictors, `none` is the FCFS baseline the others compare to
        if (seed, load, predictor, policy, router) in planned:
            continue
        planned.add((seed, load, predictor, policy, router))
        configs.append(RunConfig(trace=trace_name, predictor=predictor, policy=policy, engine=engine,
                                 load=load, arrivals=arrivals, requests=args.requests, seed=seed, tile=args.tile,
                                 engine_config=engine_config, preset=args.preset, engine_overrides=overrides,
                                 policy_options=policy_options.get(policy, ()),
                                 predictor_options=dataclasses.replace(options, seed=seed),
                                 charge_cost=predictor_cost == "charged", replicas=args.replicas, router=router))
    return configs


def has_what_it_reads(router: str, engine_config: EngineConfig) -> bool:
    """Whether a run of ``engine_config`` models what ``router`` reads (KV blocks, prefix caches)."""
    try:
        check_router_cache(router, engine_config.kv_bounded, engine_config.caches_prefixes)
    except ValueError:
        return False
    return True


def _routers(args) -> list[str]:
    """``--router``: a comma list of router names, or ``all``; one replica routes nothing, so it
    plans one run (the names still checked)."""
    names: list[str] = []
    for item in split_list("--router", args.router):
        if "=" in item and ":" not in item and names:   # a router's next setting: weighted:a=2,b=1
            names[-1] += "," + item
            continue
        names += list(ROUTERS) if item == "all" else [item]
    for spec in names:
        name = spec.partition(":")[0]
        if name in DECODE_ROUTERS and name not in ROUTERS:
            raise UsageError(f"--router {name} places requests after prefill only (choose from {', '.join(ROUTERS)}, "
                             "all; a decode router goes to --decode-router)")
        if name not in ROUTERS:
            raise UsageError(f"unknown --router {name!r} (choose from {', '.join(ROUTERS)}, all)")
    names = list(dict.fromkeys(names))
    return names if args.replicas > 1 else names[:1]


def _check_lengths_only(trace_name: str, predictors: list[str]) -> None:
    """A public trace (token counts and times only) serves the oracles and FCFS; any other predictor
    is refused up front, naming the columns it reads."""
    trace = load_trace(trace_name)
    if not trace.metadata.get("lengths_only"):
        return
    for name in predictors:
        missing = [c for c in getattr(PREDICTORS.get(name), "requires", ()) if not trace.has_feature(c)]
        if missing:
            raise UsageError(f"predictor {name!r} needs trace column(s) {', '.join(missing)}, recorded by "
                             f"capture-traces; trace {trace.name} is lengths-only: use oracle, noisy-oracle or none")


def _note_import(trace) -> None:
    """One line on stderr when importing a public trace dropped rows (0 prompt or 0 output tokens)."""
    info = trace.metadata.get("import") or {}
    if info.get("dropped_zero_tokens"):
        print(f"{PROG}: note: trace {trace.name}: dropped {info['dropped_zero_tokens']} of {info['rows']} rows "
              "with 0 prompt or 0 output tokens", file=sys.stderr)


def _warn_unsaturated(summaries: list[dict], decode_slots: int | None) -> None:
    """One line on stderr when some run never gave its policy a choice (too few requests or too
    low a load to fill the decode slots): its predictors tie with FCFS, which says nothing."""
    idle = [s for s in summaries if s.get("saturated_share") == 0 and s["policy"] != "fcfs"]
    if idle:
        loads = ", ".join(load_text(x) for x in sorted({s["load"] for s in idle}, key=lambda x: (x is None, x or 0)))
        print(f"{PROG}: warning: {len(idle)} of {len(summaries)} run(s) (load {loads}) never had more ready "
              f"requests than the {decode_slots} decode slots, so the policy never chose and every predictor "
              f"ties with FCFS; use more requests or a higher --load", file=sys.stderr)


def _check_out(out: Path, run_dirs: list[Path], created: list[Path]) -> None:
    """Fail before any run if an output folder cannot be made (a file in the way, no permission).
    Folders made here are added to ``created``, so that those still empty after a failure can go."""
    for path in [out, *run_dirs]:
        blocker = next((p for p in [path, *path.parents] if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise UsageError(f"--out {out}: {blocker} exists and is not a folder")
    for path in [out, *run_dirs]:
        created.extend(p for p in [path, *path.parents] if not p.exists() and p not in created)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--out {out}: cannot create {path} ({exc.strerror or exc})") from None
    if not os.access(out, os.W_OK):
        raise UsageError(f"--out {out}: folder is not writable")


def _note_kernel(sim, kernel: str) -> None:
    """Here, once per reason, before any worker starts: why a run uses the reference engine
    (workers would say it once each; a fleet's note was said when it was prepared)."""
    if kernel == "compiled" and isinstance(sim, Simulation):
        reason = unsupported(sim)
        if reason is not None:
            note_fallback(reason)


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders of this list that are empty, deepest first (what a failed run made)."""
    for path in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        try:
            path.rmdir()
        except OSError:   # not empty (a run wrote there), or already gone
            pass


def run(argv: list[str] | None = None, created: list[Path] | None = None) -> int:
    """The command; output folders it makes are listed in ``created`` (see :func:`main`)."""
    args = build_parser().parse_args(argv)
    configs = [dataclasses.replace(c, kernel=args.kernel) for c in _configs(args)]
    configs = with_goodput(args, with_pd(args, configs))
    check_policies(configs)
    check_find_max_rate(args, configs)
    if args.find_max_rate:
        from experiments.max_rate import find_max_rate
        return find_max_rate(configs[0], args.json)
    _note_import(load_trace(configs[0].trace))
    if args.plots and args.out is None:
        raise UsageError("--plots needs --out DIR")
    if args.plots:
        from experiments.plots import _pyplot
        _pyplot()   # fail now, not after the runs, if matplotlib is missing
    jobs = args.jobs or os.cpu_count() or 1
    # runs executed here, one after another, are run from their check (prepared and bound once);
    # runs for worker processes are prepared again there (a bound run does not travel cheaply)
    in_process = args.executor == "local" and (jobs == 1 or len(configs) == 1)
    checked = []
    decode_slots = None
    for config in configs:   # every input checked (and capacity cached) before anything runs or is written
        prepared = prepare(config)
        decode_slots = prepared.simulation.config.decode_slots
        _note_kernel(prepared.simulation, config.kernel)
        if in_process:
            checked.append(prepared)
    os.environ[NOTED_ENV] = "1"   # every fallback is said above: worker processes stay quiet
    single = checked or None
    if args.out is not None:
        run_dirs = [args.out] if len(configs) == 1 else [args.out / run_slug(c) for c in configs]
        _check_out(args.out, run_dirs, created if created is not None else [])
        for folder in {args.out, *run_dirs}:   # left by a killed earlier run of this output
            remove_stale_temps(folder)
    if any(c.kernel == "compiled" for c in configs):
        announce_compile()   # here, before workers start: a first compile takes half a minute
    show_progress = not args.quiet and not args.json and sys.stderr.isatty()
    if show_progress:
        from rich.progress import Progress
        with Progress(transient=True) as bar:
            task = bar.add_task(f"{len(configs)} run(s)", total=len(configs))
            summaries = run_many(configs, out=args.out, jobs=jobs, executor=args.executor,
                                 on_done=lambda: bar.advance(task), prepared=single)
    else:
        summaries = run_many(configs, out=args.out, jobs=jobs, executor=args.executor, prepared=single)
    add_relative_changes(summaries)
    _warn_unsaturated(summaries, decode_slots)
    if args.out is not None:
        write_results(args.out, summaries)
        if args.plots:
            from experiments.plots import write_plots
            dirs = [args.out] if len(configs) == 1 else [args.out / run_slug(c) for c in configs]
            write_plots(summaries, args.out, dirs)
        print(f"{PROG}: wrote {len(summaries)} run(s) to {args.out}", file=sys.stderr)
    if args.save_result is not None:
        save_result(args.save_result, summaries[0], configs[0])
    if args.json:
        for summary in summaries:
            print(json.dumps(summary, sort_keys=True), flush=True)
    else:
        print_table(summaries, wide=args.wide)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``simulate``: bad input (flags, traces, settings, ``--out``) is one line and exit 2 (``core.errors``)."""
    return run_command(_run_cleanly, argv, PROG, input_errors=(TraceError, ValueError, OSError))


def _run_cleanly(argv: list[str]) -> int:
    created: list[Path] = []
    try:
        with sigterm_raises_stopped():   # also while runs are prepared (capacity measured), before any starts
            return run(argv, created)
    except SweepInterrupted as exc:   # Ctrl-C or SIGTERM: finished runs are kept, a rerun skips them
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    except Stopped as exc:   # SIGTERM before any run started: nothing was written
        print(f"{PROG}: interrupted (signal {signal.Signals(exc.signum).name}) before any run started", file=sys.stderr)
        return 128 + exc.signum
    finally:
        _remove_empty(created)   # after an error, no empty run folders are left behind


if __name__ == "__main__":
    sys.exit(main())
