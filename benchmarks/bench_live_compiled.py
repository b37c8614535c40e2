"""The live engine compiled (torch.compile, vLLM's default) vs eager, LEAP's tap in both (issue 31).

    python benchmarks/bench_live_compiled.py [--requests 24] [--resident 8] [--slots 4]

Builds the in-process engine (vLLM's uni executor, SmolLM2, float32) with countdown /
leap-rls (the read-out trained on lmsys, python -m live.readout) twice on the same requests (random
prompt ids 16..128 tokens, forced lengths 2..64, seed 0): eager, then compiled. Prints, per mode,
the engine start time (EngineArgs to a ready engine, compilation included), the median and p90 of
``engine.step()`` wall time, the step count, and the largest difference of the first predictions
between the modes; and the load average before and after. Prints only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(readout: str, args, eager: bool) -> dict:
    from vllm import EngineArgs, LLMEngine, SamplingParams

    from capture.model import DEFAULT_MODEL_DIR
    from live import LiveSchedulerConfig, attach

    cfg = LiveSchedulerConfig(policy="countdown", predictor="leap-rls", max_resident=args.resident,
                              decode_slots=args.slots, readout=readout, update_every=8)
    model = Path(os.environ.get("LEAP_MODEL_DIR", DEFAULT_MODEL_DIR))
    ea = dict(model=str(model), dtype="float32", seed=0, max_model_len=512, max_num_batched_tokens=2048,
              enable_prefix_caching=False, disable_log_stats=True, enforce_eager=eager)
    ea.update(cfg.to_engine_args())
    t0 = time.perf_counter()
    engine = LLMEngine.from_engine_args(EngineArgs(**ea))
    sched = attach(engine)
    start_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    for i in range(args.requests):
        n_out = int(rng.integers(2, 65))
        prompt = rng.integers(100, 40000, size=int(rng.integers(16, 129))).tolist()
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt},
                           SamplingParams(max_tokens=n_out, min_tokens=n_out, ignore_eos=True, temperature=0.0,
                                          detokenize=False))
    steps = []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t)
    req = sched.leap_requests()
    first = dict(zip((r.rsplit("-", 1)[0] for r in req["request_id"]), req["first_predicted"]))
    engine.engine_core.shutdown()
    s = np.asarray(steps) * 1e3
    return {"start_s": round(start_s, 1), "steps": len(s), "step_ms_median": round(float(np.median(s)), 2),
            "step_ms_p90": round(float(np.percentile(s, 90)), 2),
            "first": [float(first[f"r{i}"]) for i in range(args.requests)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--resident", type=int, default=8)
    ap.add_argument("--slots", type=int, default=4)
    args = ap.parse_args()
    from bench_live_scheduler import in_process_engine_setup

    readout, _ = in_process_engine_setup("bench_live_compiled_readout.npz")
    load_before = os.getloadavg()
    out = {mode: run(str(readout), args, eager=mode == "eager") for mode in ("eager", "compiled")}
    diff = float(np.max(np.abs(np.subtract(out["eager"].pop("first"), out["compiled"].pop("first")))))
    print(json.dumps({"eager": out["eager"], "compiled": out["compiled"], "max_abs_first_prediction_diff": diff,
                      "loadavg_1_5_15_before": [round(x, 2) for x in load_before],
                      "loadavg_1_5_15_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()},
                     indent=1))


if __name__ == "__main__":
    main()
