"""``leap-serve``'s in-process engine: start vLLM with the live scheduler, measure the live capacity if asked,
serve the planned arrivals through its step loop and record the serving trace (``live.serve``'s docstring)."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

import numpy as np

from capture import CaptureError
from capture.record import host_description
from live import kv_cache, stepclock
from live.fleet import fleet_column, fleet_estimates, fleet_scheduler_stats, start_fleet
from live.serve_capacity import write_capacity
from live.serve_files import file_ref, write_json
from live.serve_records import check_written, read_sched_parts, serve_table, write_sched_part
from live.serve_workload import ServeRequest, check_kv

SERVE_TIMING = ("open loop: each request is submitted at the first engine-step boundary after its "
                "planned arrival (planned_arrival_s); arrival_s is the actual submission offset "
                "from the start of the run segment, shifted onto the planned time axis (see "
                "serving.segments); ttft_s, e2e_s and token_times_s are seconds from the "
                "request's submission; all timings are on this host, in eager mode")


def run_engine(args, w, run, log) -> int:
    """Start the in-process engine, measure the capacity if asked, then serve and record the run."""
    live, reqs, src, cfg, n, rows = w.live, w.reqs, w.src, w.cfg, w.n, w.rows
    model_dir, template, tsha, dtype, max_model_len = w.model_dir, w.template, w.tsha, w.dtype, w.max_model_len
    est_blocks, kv_need = w.est_blocks, w.kv_need
    sampling, out, planned, arrivals_desc, load, rate = (run.sampling, run.out, run.planned, run.arrivals_desc,
                                                           run.load, run.rate)
    capacity, capacity_how, key, workload, engine_desc = (run.capacity, run.capacity_how, run.key, run.workload,
                                                          run.engine_desc)
    measure, threads_n, t_start, engine_overrides = run.measure, run.threads_n, run.t_start, run.engine_overrides
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise CaptureError(f"vllm is not importable ({e}); use the capture venv") from None
    from capture.backend import GenRequest
    from capture.backend_vllm import VLLMBackend

    def params_for(req: ServeRequest):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        forced: dict[str, Any] = dict(min_tokens=req.length, ignore_eos=True) if args.force_lengths else {}
        if live is not None and live.form.prompt_text:
            from live import PROMPT_TEXT_KEY
            forced["extra_args"] = {PROMPT_TEXT_KEY: req.prompt_text}
        return SamplingParams(temperature=sampling["temperature"], top_p=sampling["top_p"],
                              repetition_penalty=sampling["repetition_penalty"],
                              max_tokens=req.length, output_kind=RequestOutputKind.DELTA,
                              detokenize=False, **forced)

    store = None
    run_config = None
    if out is not None:
        from capture.store import PartStore

        store = PartStore(out)
        store.lock()  # before the engine starts: a second process on this output exits at once
        run_config = {**workload, **engine_desc, "policy": args.policy, "predictor": args.predictor,
                      "arrivals": arrivals_desc if planned is not None else args.arrivals,
                      "load": load, "seed": args.seed, "probe_every": args.probe_every,
                      **({"clock": "steps"} if args.clock == "steps" else {}),
                      **({"replicas": args.replicas, "router": args.router or "round-robin"}
                         if args.replicas > 1 else {})}
        if planned is not None:
            run_config[stepclock.rate_key(args.clock)] = rate
    def new_backend(threads):
        return VLLMBackend(model_dir, last_layers=[], decode_layers=[], decode_every=0, dtype=dtype,
                           seed=args.seed, max_model_len=max_model_len, max_num_seqs=args.max_resident,
                           max_num_batched_tokens=args.max_num_batched_tokens,
                           kv_space_gib=args.kv_space_gib, threads=threads, executor=args.executor,
                           probe_every=args.probe_every, engine_overrides=engine_overrides, log=log)

    fleet = start_fleet(args, new_backend, log) if args.replicas > 1 else None
    be: Any = fleet.replicas[0].backend if fleet is not None else new_backend(args.threads)
    try:
        if live is not None and fleet is None:
            import live as live_pkg

            try:
                live_pkg.attach(be.engine)   # hook <-> scheduler channel (LEAP predictors)
            except ValueError as e:
                raise CaptureError(f"live scheduler: {e}") from None
        kv_cache.check_engine_blocks(be.kv_blocks, args)
        if be.kv_blocks and be.kv_blocks != est_blocks and args.kv_blocks is None:
            log(f"engine has {be.kv_blocks} KV blocks (estimate {est_blocks})")
            check_kv(reqs, args.max_resident, be.kv_blocks, be.block_size or 128, args.kv_space_gib,
                     "reported by the engine")
        quiet = be.engine.collective_rpc("ct_probe", args=(20, True))[0]
        quiet_probe, quiet_mem_probe = quiet["probe_s"], quiet["probe_mem_s"]
        by_id = {r.request_id: r for r in reqs}
        gen_reqs = [GenRequest(r.request_id, list(r.prompt_token_ids), r.fields) for r in reqs]
        if measure:
            log(f"measuring the live capacity: {n} requests queued at t=0, {args.max_resident} resident")
            res = be.saturated_capacity(gen_reqs, lambda g: params_for(by_id[g.request_id]),
                                        args.max_resident)
            res.update({"workload": workload, "engine": engine_desc,
                        "measured": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                        "quiet_probe_median_s": float(np.median(quiet_probe))})
            write_capacity(key, res)
            capacity, capacity_how = stepclock.capacity_of(res, args.clock), "measured"
            log(f"capacity {res['capacity_req_s']:.4f} req/s, {res['capacity_req_per_step']:.5f} req/step "
                f"({res['completions_in_window']} completions in {res['window_s']:.1f}s, "
                f"{res['window_steps']} steps saturated; makespan {res['makespan_s']:.1f}s, "
                f"{res['generated_tokens']} tokens)")
            print(json.dumps({"key": key, **{
                k: res[k] for k in ("capacity_req_s", "capacity_req_per_step", "saturated", "window_s",
                                    "window_steps", "completions_in_window", "requests", "makespan_s",
                                    "makespan_steps", "generated_tokens", "steps")}}))
            if args.arrivals is None:
                return 0
            if load is not None:
                assert run_config is not None   # --capacity measure with --arrivals writes --out
                rate = load * capacity
                run_config[stepclock.rate_key(args.clock)] = rate
                planned, arrivals_desc = stepclock.planned_arrivals(args, n, rate)
                run_config["arrivals"] = arrivals_desc
        serving = {"mode": "open-loop", "arrivals": arrivals_desc, "load": load,
                   "rate_req_s": rate, "capacity_req_s": capacity, "capacity_source": capacity_how,
                   "capacity_key": key, "policy": args.policy, "predictor": args.predictor,
                   "max_resident": args.max_resident,
                   "decode_slots": live.decode_slots if live is not None else args.max_resident,
                   "scheduler": "live" if live is not None else "vllm",
                   "wait_cap": live.wait_cap if live is not None else None,
                   "ordered_admission": live.orders_admission if live is not None else False,
                   "readout": file_ref(args.readout), "layer": live.hook_layer if live is not None else None,
                   "head_weights": file_ref(args.head_weights),
                   "prior_tokens": live.prior_tokens if live is not None else None,
                   "max_num_batched_tokens": args.max_num_batched_tokens,
                   "forced_lengths": args.force_lengths, "max_length": args.max_length,
                   "source_trace": {"name": src.name, "sha256": src.content_hash,
                                    "rows": [int(i) for i in rows] if args.sample else f"first {n}"},
                   "seed": args.seed, "threads": threads_n, "kv_blocks": be.kv_blocks,
                   "kv_blocks_needed_at_cap": kv_need, **stepclock.serving_fields(args.clock, capacity, rate),
                   **kv_cache.serving_fields(args),
                   **({"replicas": args.replicas, "router": fleet.router.name} if fleet is not None else {})}
        return _serve_run(args, fleet or be, store, out, run_config, reqs, planned, params_for, serving,
                          (quiet_probe, quiet_mem_probe), src, cfg, model_dir, template, tsha, sampling, dtype,
                          max_model_len, t_start, log)
    finally:
        (fleet or be).close()


def _serve_run(args, be, store, out, run_config, reqs, planned, params_for, serving, quiet_probe,
               src, cfg, model_dir, template, tsha, sampling, dtype, max_model_len, t_start, log):
    from capture.backend import GenRequest
    from capture.finalize import finalize
    from capture.schema import steps_table
    if args.resume and out.exists() and not store.dir.exists():
        from capture.store import read_meta
        if read_meta(out).get("run_config") == run_config:
            log(f"{out} is up to date ({len(reqs)} requests)")
            return 0
    with store.segment(run_config, resume=args.resume):
        done = store.done_ids("gen")
        steps_clock = serving["clock"] == "steps"   # arrival steps, never shifted (no resume)
        todo = [(planned[i].item(), r) for i, r in enumerate(reqs) if r.request_id not in done]
        shift = todo[0][0] if todo and not steps_clock else 0.0
        segment = {"run": store.run, "requests": len(todo), "schedule_shift_s": shift}
        write_json(store.dir / f"segment-{store.run:03d}.json", segment)
        planned_of = {r.request_id: None if steps_clock else float(planned[i]) for i, r in enumerate(reqs)}
        by_id = {r.request_id: r for r in reqs}
        log(f"{len(reqs)} requests, {len(done)} already served; segment {store.run}: {len(todo)} at "
            + (f"{serving['rate_req_per_step'] or 0:.5f} req/step" if steps_clock
               else f"{serving['rate_req_s'] or 0:.4f} req/s") + f" ({serving['arrivals']})")
        info = be.info()
        write_json(store.dir / "backend.json", info)
        stats = {"requests": 0, "generated_tokens": 0, "wall_s": 0.0, "backend": "vllm",
                 "executor": info.get("executor"), "engine_startup_s": be.startup_s,
                 "segment_shift_s": shift}
        step_no = {"n": 0}

        def on_steps(rows):
            for r in rows:
                r["run"] = store.run
                r["run_step"] = step_no["n"]
                r["wall_start_s"] = r["wall_start_s"] + shift
                step_no["n"] += 1
            store.write("steps", steps_table(rows))

        def on_finished(fins):
            estimates = fleet_estimates(be, by_id)
            preempted = fleet_column(be, by_id, "preemptions") if args.kv_blocks is not None else None
            cache = None
            if kv_cache.caches_prefixes(args):   # vLLM's hits, and the prompts' block hashes a replay names them by
                hashes = {f.request.request_id: kv_cache.prompt_hashes(by_id[f.request.request_id].prompt_token_ids,
                                                                        args) for f in fins}
                cache = (fleet_column(be, by_id, "cached_tokens"), hashes, fleet_column(be, by_id, "output_hashes"))
            store.write("gen", serve_table(fins, by_id, planned_of, store.run, shift, estimates, preempted, cache))
            stats["requests"] += len(fins)
            stats["generated_tokens"] += sum(f.output_tokens for f in fins)
            write_json(store.dir / f"run-{store.run:03d}.json", stats)

        schedule = [(p - shift, GenRequest(r.request_id, list(r.prompt_token_ids), r.fields), params_for(r))
                    for p, r in todo]
        if schedule:
            res = (be.serve_steps if steps_clock else be.serve)(schedule, on_finished, on_steps,
                                                                 flush_n=args.flush_every)
            stats.update(wall_s=res["wall_s"], engine_steps=res["steps"], ticks=res.get("ticks"))
            if not steps_clock:
                lag = np.asarray(res["submit_lag_s"])
                stats["submit_lag_s"] = {"median": float(np.median(lag)), "p99": float(np.quantile(lag, 0.99)),
                                         "max": float(lag.max())}
            write_json(store.dir / f"run-{store.run:03d}.json", stats)

        sched = fleet_scheduler_stats(be)
        if sched:
            write_sched_part(store, sched)
        sched_table = read_sched_parts(store)
        if sched_table is not None:  # side tables before the trace (finalize writes it last)
            from capture.store import atomic_write_table
            from core.trace import side_table_path
            atomic_write_table(sched_table, side_table_path(out, "sched"),
                               {"schema_version": 1, "table": "sched", "trace": out.name,
                                "source": "live scheduler leap_stats(), one row per entry; run = segment"})
        steps = store.read("steps")
        serving["probe"] = probe_summary(args, steps, quiet_probe)
        serving["segments"] = [json.loads(f.read_text()) for f in sorted(store.dir.glob("segment-*.json"))]
        serving["segments"] = [s for s in serving["segments"] if s["requests"] or s["run"] == store.run]
        meta = trace_meta(args, run_config, reqs, serving, src, cfg, model_dir, template, tsha, sampling, dtype,
                          max_model_len, steps_clock)
        finalize(store, reqs, meta, info, hidden=cfg["hidden_size"], log=log)
    return check_written(out, len(reqs), t_start, log)


def probe_summary(args, steps, quiet_probe) -> dict:
    """The drift probe's figures: the quiet reference before the run, the probes during it (matmul and memory)."""
    from capture.vllm_ext import PROBE_MEM_ELEMENTS, PROBE_MEM_EVERY

    probes = np.array([], dtype=float)
    if steps is not None and "probe_s" in steps.column_names:
        probes = np.array([v for v in steps.column("probe_s").to_pylist() if v is not None])
    quiet_probe, quiet_mem_probe = quiet_probe
    q = np.asarray(quiet_probe, dtype=float)
    mem = np.array([v for v in steps.column("probe_mem_s").to_pylist() if v is not None], dtype=float) \
        if steps is not None and "probe_mem_s" in steps.column_names else np.array([], dtype=float)
    qm = np.asarray(quiet_mem_probe, dtype=float)
    return {
        "every_steps": args.probe_every, "workload": "2 x 192x192 fp32 torch.mm on the engine's threads",
        "before_run_median_s": float(np.median(q)),
        "measured": int(len(probes)),
        **({"median_s": float(np.median(probes)), "p90_s": float(np.quantile(probes, 0.9)),
            "max_s": float(probes.max()), "cv": float(probes.std() / probes.mean()),
            "median_over_before_run": float(np.median(probes) / np.median(q))}
           if len(probes) else {}),
        "memory": {
            "every_steps": args.probe_every * PROBE_MEM_EVERY,
            "workload": f"sum over a {PROBE_MEM_ELEMENTS * 4 // 2**20} MiB fp32 buffer (beyond the L3: "
                        "DRAM bandwidth)",
            "before_run_median_s": float(np.median(qm)), "measured": int(len(mem)),
            **({"median_s": float(np.median(mem)), "p90_s": float(np.quantile(mem, 0.9)),
                "median_over_before_run": float(np.median(mem) / np.median(qm)),
                "p90_over_before_run": float(np.quantile(mem, 0.9) / np.median(qm)),
                "overhead_share_of_step_s": float(mem.sum() / max(sum(
                    v for v in steps.column("step_s").to_pylist() if v is not None), 1e-12))}
               if len(mem) else {}),
        },
    }


def trace_meta(args, run_config, reqs, serving, src, cfg, model_dir, template, tsha, sampling, dtype,
               max_model_len, steps_clock) -> dict:
    """The serving trace's metadata (finalize adds the backend's and the tables')."""
    from capture.model import model_id

    return {
        "schema_version": 1,
        "model_id": model_id(model_dir),
        "model_revision": run_config["model_revision"],
        "layers": {},
        "num_layers": cfg["num_hidden_layers"],
        "hidden_size": cfg["hidden_size"],
        "dtype": dtype,
        "sampling": {**sampling, "seed": args.seed,
                     "forced_lengths": "ignore_eos, min_tokens = max_tokens = L" if args.force_lengths else None},
        "max_tokens": max(r.length for r in reqs),
        "max_model_len": max_model_len,
        "chat_template": template,
        "chat_template_sha256": tsha,
        "prompt_sources": src.metadata.get("prompt_sources"),
        "capture_date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": host_description(),
        "timing": stepclock.STEP_TIMING if steps_clock else SERVE_TIMING,
        "decode_every_k": 0,
        "decode_layers": [],
        "run_config": run_config,
        "complete": True,
        "planned_requests": len(reqs),
        "serving": serving,
        "text_encoder": None,
        **({"prefix_block_size": kv_cache.block_size(args)} if kv_cache.caches_prefixes(args) else {}),
    }

