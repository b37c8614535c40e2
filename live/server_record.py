"""Recording a ``leap-serve --server`` run: parts, segments, resume, the final serving trace.

The same store and trace contract as the in-process run (``capture.store.PartStore``,
``live.serve_records.serve_table``, ``capture.finalize``); the requests go through
``live.http_client``. Each finished request is checked as it lands: the server's prompt token
count equals the in-process one, the streamed token ids count equals the usage's completion
tokens, and a forced length was honoured.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import ipaddress
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from capture import CaptureError
from capture.record import host_description
from live.http_client import base_url
from live.serve_files import write_json
from live.serve_records import check_written

#: How the trace's times were taken (its ``timing`` metadata).
SERVER_TIMING = ("open loop through HTTP: each request is sent (a streamed chat completion) at its "
                 "planned arrival (planned_arrival_s); arrival_s is the client's send time from the start "
                 "of the run segment, shifted onto the planned time axis (see serving.segments); "
                 "ttft_s, e2e_s and token_times_s are seconds from the send to the client's reading of "
                 "each token's chunk; all timings on the client's host, server in eager mode")


def server_label(server: str) -> str:
    """The server as metadata may name it: ``127.0.0.1:PORT`` on the loopback, else only ``remote``."""
    url = urlsplit(server)
    try:
        loopback = ipaddress.ip_address(url.hostname or "").is_loopback
    except ValueError:
        loopback = url.hostname == "localhost"
    return f"127.0.0.1:{url.port}" if loopback else "remote"


def engine_desc(args, w, settings: dict) -> dict:
    """The engine the run config names: the server's, as it reported it."""
    from capture.backend_vllm import parse_cpu_list
    from capture.model import model_revision

    bind = (settings.get("env") or {}).get("VLLM_CPU_OMP_THREADS_BIND")
    return {"model_revision": model_revision(w.model_dir), "dtype": settings["dtype"],
            "max_model_len": settings["max_model_len"], "max_resident": settings["max_num_seqs"],
            "decode_slots": settings["leap"]["decode_slots"], "scheduler": "live", "wait_cap": settings["leap"]["wait_cap"],
            "max_num_batched_tokens": settings["max_num_batched_tokens"], "kv_blocks": settings.get("kv_blocks"),
            "threads": len(parse_cpu_list(bind, local=False)) if bind and bind not in ("auto", "nobind") else None,
            "sampling": w.sampling, "engine": f"vllm {settings['vllm']} (server)"}


def checked(sent, req, forced: bool) -> None:
    from live.http_client import ServerError

    rid = req.request_id
    if sent.finish_reason is None:
        raise ServerError(f"request {rid}: the stream ended without a finish reason")
    if sent.prompt_tokens != len(req.prompt_token_ids):
        raise ServerError(f"request {rid}: the server counted {sent.prompt_tokens} prompt tokens, the run "
                          f"{len(req.prompt_token_ids)}")
    if sent.output_tokens != len(sent.token_times_s):
        raise ServerError(f"request {rid}: usage says {sent.output_tokens} tokens, {len(sent.token_times_s)} streamed")
    if forced and sent.output_tokens != req.length:
        raise ServerError(f"request {rid}: {sent.output_tokens} tokens generated, forced length {req.length}")


def record_run(args, w, settings: dict, served_model: str, log) -> int:
    """Record the run against a checked server (``settings``: its public settings; ``served_model``: the
    model name its requests must carry)."""
    from capture.store import PartStore, read_meta

    out = Path(args.out)
    store = PartStore(out)
    store.lock()
    run_config = {**w.workload, **engine_desc(args, w, settings), "policy": args.policy,
                  "predictor": args.predictor, "arrivals": w.arrivals_desc, "load": w.load, "seed": args.seed,
                  "rate_req_s": w.rate, "mode": "server"}
    if args.resume and out.exists() and not store.dir.exists():
        if read_meta(out).get("run_config") == run_config:
            log(f"{out} is up to date ({len(w.reqs)} requests)")
            return 0
    with store.segment(run_config, resume=args.resume):
        stats = _serve_segment(args, w, store, served_model, log)
        meta = trace_meta(args, w, settings, store, run_config, stats)
        from capture.finalize import finalize

        finalize(store, w.reqs, meta, {"backend": "vllm-server", "backend_version": settings["vllm"],
                                       "eager": settings["enforce_eager"]}, hidden=w.cfg["hidden_size"], log=log)
    return check_written(out, len(w.reqs), w.t_start, log)


def _serve_segment(args, w, store, served_model: str, log) -> dict:
    """Serve the requests not yet finished as a new run segment; returns the segment's stats."""
    from live.config import PROMPT_TEXT_KEY
    from live.http_client import ServerError, chat_body, serve_schedule
    from live.serve_records import serve_table

    done = store.done_ids("gen")
    todo = [(float(w.planned[i]), r) for i, r in enumerate(w.reqs) if r.request_id not in done]
    shift = todo[0][0] if todo else 0.0
    write_json(store.dir / f"segment-{store.run:03d}.json",
                {"run": store.run, "requests": len(todo), "schedule_shift_s": shift})
    planned_of = {r.request_id: float(w.planned[i]) for i, r in enumerate(w.reqs)}
    by_id = {r.request_id: r for r in w.reqs}
    rate = f"{w.rate:.4f} req/s" if w.rate else "the recorded times"
    log(f"{len(w.reqs)} requests, {len(done)} already served; segment {store.run}: {len(todo)} at {rate} "
        f"({w.arrivals_desc})")
    stats: dict[str, Any] = {"requests": 0, "generated_tokens": 0, "wall_s": 0.0, "backend": "vllm-server",
                             "segment_shift_s": shift}
    lock = asyncio.Lock()

    async def on_finished(batch) -> None:
        for sent in batch:
            checked(sent, sent.request, args.force_lengths)
        table = serve_table(batch, by_id, planned_of, store.run, shift)
        async with lock:                    # one writer at a time (part numbering)
            await asyncio.to_thread(store.write, "gen", table)
            stats["requests"] += len(batch)
            stats["generated_tokens"] += sum(s.output_tokens for s in batch)
            await asyncio.to_thread(write_json, store.dir / f"run-{store.run:03d}.json", stats)

    reads_text = w.live.form.prompt_text   # the live predictor scores the raw prompt text
    extra = (lambda r: {PROMPT_TEXT_KEY: r.prompt_text}) if reads_text else (lambda r: None)
    schedule = [(p - shift, r, chat_body(served_model, r.prompt_text, w.sampling, r.length, args.force_lengths, extra(r),
                                         r.fields)) for p, r in todo]
    if schedule:
        try:
            res = asyncio.run(serve_schedule(base_url(args.server), schedule, on_finished, args.flush_every))
        except ServerError as e:
            raise CaptureError(f"--server {args.server}: {e} (finished requests are kept; rerun with --resume)") \
                from None
        lag = np.asarray(res["submit_lag_s"])
        stats.update(wall_s=res["wall_s"], submit_lag_s={"median": float(np.median(lag)),
                                                         "p99": float(np.quantile(lag, 0.99)), "max": float(lag.max())})
        write_json(store.dir / f"run-{store.run:03d}.json", stats)
    return stats


def trace_meta(args, w, settings: dict, store, run_config: dict, stats: dict) -> dict:
    from capture.model import model_id

    leap = settings["leap"]             # the server's scheduler, as it reported it
    segments = [json.loads(f.read_text()) for f in sorted(store.dir.glob("segment-*.json"))]
    serving = {
        "mode": "server", "server": server_label(args.server), "server_settings": settings,
        "arrivals": w.arrivals_desc, "load": w.load, "rate_req_s": w.rate, "capacity_req_s": w.capacity,
        "capacity_source": w.capacity_how, "capacity_key": None, "policy": leap["policy"], "predictor": leap["predictor"],
        "max_resident": settings["max_num_seqs"], "decode_slots": leap["decode_slots"], "scheduler": "live",
        "wait_cap": leap["wait_cap"], "ordered_admission": leap["orders_admission"], "readout": leap["readout"],
        "layer": leap["layer"], "head_weights": leap["head_weights"], "prior_tokens": leap["prior_tokens"],
        "max_num_batched_tokens": settings["max_num_batched_tokens"], "forced_lengths": args.force_lengths,
        "max_length": args.max_length,
        "source_trace": {"name": w.src.name, "sha256": w.src.content_hash, "rows": w.rows},
        "seed": args.seed, "threads": run_config["threads"], "kv_blocks": settings.get("kv_blocks"),
        "clock": "seconds", "probe": None,
        "segments": [s for s in segments if s["requests"] or s["run"] == store.run],
    }
    return {
        "schema_version": 1, "model_id": model_id(w.model_dir), "model_revision": run_config["model_revision"],
        "layers": {}, "num_layers": w.cfg["num_hidden_layers"], "hidden_size": w.cfg["hidden_size"],
        "dtype": w.dtype,
        "sampling": {**w.sampling, "seed": args.seed,
                     "forced_lengths": "ignore_eos, min_tokens = max_tokens = L" if args.force_lengths else None},
        "max_tokens": max(r.length for r in w.reqs), "max_model_len": w.max_model_len,
        "chat_template": w.template, "chat_template_sha256": w.tsha,
        "prompt_sources": w.src.metadata.get("prompt_sources"),
        "capture_date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": host_description(), "timing": SERVER_TIMING, "decode_every_k": 0, "decode_layers": [],
        "run_config": run_config, "complete": True, "planned_requests": len(w.reqs), "serving": serving,
        "text_encoder": None,
    }
