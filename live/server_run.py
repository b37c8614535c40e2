"""``leap-serve --server URL``: the same serving run, driven over HTTP against a running ``vllm serve``.

The workload (requests, prompts, forced lengths, sampling, the Poisson schedule) is built by
``live.serve`` exactly as for the in-process run; this module checks the server, sends the
requests (``live.http_client``) and writes the same serving trace, ``serving.mode = "server"``.

What the server runs is read from the server, not assumed: the plugin's settings endpoint
(``GET /leap_sched/settings``, ``leap_sched.vllm.endpoint``) reports its scheduler class, the
``leap`` settings as its scheduler reads them and its engine settings. The run is refused
(one line, exit 2, before any request is sent or any file written) when the server is
unreachable, does not run the plugin, serves another model, or runs settings other than the
flags given (policy, predictor, slots, wait cap, read-out by content hash, resident cap, token
budget, dtype, model length); and when its chat template does not turn a prompt into the same
token ids as the in-process run (every prompt is checked with the server's ``/tokenize``).
Those settings are recorded in ``serving.server_settings``.

No engine steps, drift probe or scheduler side tables: the client sees none of them. Resume
and Ctrl-C work as in the in-process run (finished requests are kept in ``OUT.parts``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from capture import CaptureError
from live.http_client import base_url
from live.serve_files import file_ref
from live.server_record import record_run, server_label


@dataclass
class ServerWorkload:
    """What ``live.serve`` built for the run (the same for the in-process engine)."""

    reqs: list
    planned: np.ndarray
    arrivals_desc: str
    rate: float | None               # None: arrivals from a CSV
    load: float | None
    capacity: float | None
    capacity_how: str | None
    live: Any                        # live.config.LiveSchedulerConfig
    workload: dict
    src: Any                         # core.trace.Trace
    cfg: dict
    model_dir: Path
    template: str
    tsha: str
    sampling: dict
    dtype: str
    max_model_len: int
    rows: list | str
    t_start: float


def check_server(args) -> dict | None:
    """``--server``: the flags it cannot honour, then the server itself (reachable, running the plugin);
    its settings as it reports them. Before any file is read; None without ``--server``."""
    if args.server is None:
        return None
    url = urlsplit(args.server)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise CaptureError(f"--server {args.server!r}: expected a URL such as http://127.0.0.1:8000")
    refused = {"--clock steps": args.clock == "steps", "--capacity measure": args.capacity == "measure",
               "--threads": args.threads is not None, "--executor mp": args.executor != "uni",
               "--scheduler vllm": args.scheduler == "vllm"}
    for flag, given in refused.items():
        if given:
            raise CaptureError(f"--server: {flag} applies to the in-process engine (the server runs its own)")
    if args.arrivals is None:
        raise CaptureError("--server needs --arrivals poisson|FILE.csv")
    if args.load is not None and args.capacity is None:
        raise CaptureError("--server --load X needs --capacity REQ_S (the cached capacities describe in-process "
                           "engines)")
    try:
        return asyncio.run(fetch_settings(args.server))
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 -- httpx/JSON surprises: one line, nothing written
        raise CaptureError(f"--server {args.server}: {type(e).__name__}: {e}") from None


async def fetch_settings(server: str) -> dict:
    """The plugin's report of what the server runs (``GET /leap_sched/settings``), after ``/health``."""
    import httpx

    from live.http_client import SETTINGS_PATH, get_json

    base = base_url(server)
    async with httpx.AsyncClient() as client:
        try:
            status, _ = await get_json(client, f"{base}/health")
        except httpx.HTTPError as e:
            raise CaptureError(f"--server {server}: cannot reach it ({type(e).__name__}: {e or 'no answer'})") \
                from None
        if status != 200:
            raise CaptureError(f"--server {server}: /health answered {status}")
        status, got = await get_json(client, f"{base}{SETTINGS_PATH}")
    if status == 404:
        raise CaptureError(f"--server {server}: no {SETTINGS_PATH}: the server does not run the leap_sched "
                           "plugin (start it with the command python -m live.cli prints)")
    if status != 200 or not isinstance(got, dict):
        detail = got.get("error") if isinstance(got, dict) else got
        raise CaptureError(f"--server {server}: {SETTINGS_PATH} answered {status}: {detail}")
    if got.get("leap") is None:
        raise CaptureError(f"--server {server}: its scheduler is {got.get('scheduler_cls')}, not leap_sched's "
                           "(start it with the command python -m live.cli prints)")
    return got


def expected_settings(args, w: ServerWorkload) -> dict:
    """The server settings these flags mean (compared with what the server reports)."""

    live = w.live
    want = {"leap.policy": live.policy, "leap.predictor": live.predictor, "leap.decode_slots": live.decode_slots,
            "leap.wait_cap": live.wait_cap, "leap.readout": file_ref(live.readout), "leap.layer": live.hook_layer,
            "leap.head_weights": file_ref(live.head_weights), "leap.ordered_admission": live.ordered_admission,
            "leap.prior_tokens": live.prior_tokens, "leap.update_every": live.update_every,
            "leap.sync_updates": live.sync_updates, "max_num_seqs": args.max_resident,
            "max_num_batched_tokens": args.max_num_batched_tokens, "dtype": w.dtype, "max_model_len": w.max_model_len,
            "enforce_eager": True, "enable_prefix_caching": False, "seed": args.seed}
    if not live.form.has_predictor:     # no estimates: the prior is never read
        del want["leap.prior_tokens"]
    return want


def check_settings(args, w: ServerWorkload, got: dict) -> None:
    """Refuse a server whose plugin, model or settings differ from the run's (one line, the first difference)."""
    from capture.model import model_id

    mine = model_id(w.model_dir)
    if got["model"].get("id") != mine or (got["model"]["hidden_size"], got["model"]["num_layers"]) != (
            w.cfg["hidden_size"], w.cfg["num_hidden_layers"]):
        raise CaptureError(f"--server {args.server} serves {got['model'].get('id') or 'another model'}, not {mine} "
                           f"(--model {args.model})")
    for key, want in expected_settings(args, w).items():
        have = got["leap"].get(key[5:]) if key.startswith("leap.") else got.get(key)
        if have != want:
            raise CaptureError(f"--server {args.server} runs {key} = {have!r}, this run needs {want!r}; start the "
                               "server with the run's settings (python -m live.cli prints the command)")


async def check_prompts(args, w: ServerWorkload, model: str) -> None:
    """Every prompt: the server's chat template must make the in-process run's token ids."""
    import httpx

    from live.http_client import tokenize_chat

    async with httpx.AsyncClient() as client:
        for r in w.reqs:
            ids = await tokenize_chat(client, base_url(args.server), model, r.prompt_text)
            if ids != list(r.prompt_token_ids):
                raise CaptureError(f"--server {args.server}: request {r.request_id}: the server's chat template makes "
                                   f"{len(ids)} prompt tokens, the in-process tokenizer {len(r.prompt_token_ids)} "
                                   f"(differing token ids): another chat template or tokenizer")


def public_settings(got: dict) -> dict:
    """The server's settings without machine paths (the served model name may be a local folder)."""
    return {**got, "model": {**got["model"], "served_model_name": Path(got["model"]["served_model_name"]).name}}


def run_against_server(args, got: dict, w: ServerWorkload, log) -> int:
    """The run through HTTP against the server whose settings ``got`` are (``check_server``): the rest of
    the checks (settings, KV room, prompts), then the schedule, the parts, the trace."""
    check_settings(args, w, got)
    if got.get("kv_blocks"):
        from live.serve_workload import check_kv

        check_kv(w.reqs, args.max_resident, got["kv_blocks"], got.get("block_size") or 128, args.kv_space_gib,
                 "reported by the server")
    model = got["model"]["served_model_name"]
    try:
        asyncio.run(check_prompts(args, w, model))
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 -- httpx/JSON surprises: one line, nothing written
        raise CaptureError(f"--server {args.server}: {type(e).__name__}: {e}") from None
    log(f"server {server_label(args.server)}: {got['scheduler_cls']}, {got['leap']['policy']}/"
        f"{got['leap']['predictor']}, {got['leap']['decode_slots']} of {got['max_num_seqs']} decode; "
        f"{len(w.reqs)} prompts tokenized alike")
    return record_run(args, w, public_settings(got), model, log)
