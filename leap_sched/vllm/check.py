"""Check live-scheduler settings against a model before any engine starts; print the engine arguments.

    python -m leap_sched.vllm.check --model DIR --policy countdown --predictor leap-rls --readout leap_readout.npz \
        --max-resident 64 --decode-slots 16 --kv-cache-gib 4

Exit 0 with the in-process engine arguments and the ``vllm serve`` command (leap_sched.vllm) as
JSON, and that command on stderr;
a setting vLLM cannot honour prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from leap_sched.vllm.command import serve_command
from live.config import LIVE_POLICIES, LiveConfigError, LiveSchedulerConfig
from predictors.live import LIVE_PREDICTORS


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
    ap.add_argument("--kv-cache-gib", type=float, required=True, help="KV cache space (VLLM_CPU_KVCACHE_SPACE)")
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
                                block_size=args.block_size)
    except LiveConfigError as e:
        print(f"live: {e}", file=sys.stderr)
        return 2
    engine_args = cfg.to_engine_args()
    serve = serve_command(cfg, args.model)
    print(json.dumps({"engine_args": engine_args, "model": facts, "serve_command": serve}, sort_keys=True))
    print(f"serve with: {serve}", file=sys.stderr)
    print(f"(vllm-cpu: {serve_command(cfg, args.model, launcher='module')})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
