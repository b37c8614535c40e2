"""vLLM backend: LLMEngine step loop + the CaptureExt worker extension (see capture.vllm_ext).

Must be driven from a ``if __name__ == "__main__":`` guarded entry point (vLLM spawns workers).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from . import CaptureError
from .backend import Backend, Finished, GenRequest

#: per-request step marks (docs/semantics.md "Step clock"), set while serving
STEP_MARKS = ("arrival_step", "admit_step", "first_token_step", "finish_step")


class VLLMBackend(Backend):
    name = "vllm"

    def __init__(self, model_dir, *, last_layers, decode_layers, decode_every, dtype="float32",
                 seed=0, max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=2048,
                 kv_space_gib=4, threads=None, window=None, executor="uni", probe_every=8,
                 engine_overrides=None, log=print):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if executor == "uni":
            # engine core and model in this process: the multiprocess layout's engine core
            # busy-polls its shared-memory queue and burns a second core on a CPU host
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_space_gib))
        pinned = parse_cpu_list(threads) if threads and executor == "uni" else None
        if threads:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", threads)
            if pinned:   # vLLM binds OpenMP threads only in its multiprocess executor
                os.sched_setaffinity(0, pinned)
                os.environ["OMP_NUM_THREADS"] = str(len(pinned))
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch
        import vllm
        from vllm import EngineArgs, LLMEngine

        if pinned:
            torch.set_num_threads(len(pinned))

        self.version = vllm.__version__
        self.log = log
        self.last_layers = list(last_layers)
        self.decode_layers = list(decode_layers)
        self.window = window or max_num_seqs + max(4, max_num_seqs // 8)
        self.engine_args = dict(
            model=str(model_dir), enforce_eager=True, dtype=dtype, seed=seed,
            max_model_len=max_model_len, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=False,
            worker_extension_cls="capture.vllm_ext.CaptureExt", disable_log_stats=True,
        )
        if executor == "uni":
            self.engine_args["distributed_executor_backend"] = "uni"
        self.engine_args.update(engine_overrides or {})  # e.g. a live scheduler (live.serve)
        self.executor = executor
        args = EngineArgs(**self.engine_args)
        if not args.enforce_eager:
            raise CaptureError("internal: vLLM capture requires enforce_eager=True")
        t = time.perf_counter()
        # Any: driven through add_request/step with token-id prompts, which vLLM's stubs type narrower
        self.engine: Any = LLMEngine.from_engine_args(args)
        self.startup_s = time.perf_counter() - t
        info = self.engine.collective_rpc(
            "ct_install", args=(self.last_layers, self.decode_layers, decode_every, probe_every))[0]
        self.kv_blocks = info.get("num_blocks")
        self.block_size = info.get("block_size")
        cc = self.engine.vllm_config.compilation_config
        mode = getattr(cc, "mode", getattr(cc, "level", None))
        self.eager = bool(self.engine.vllm_config.model_config.enforce_eager)
        if not self.eager:
            raise CaptureError("vLLM did not run in eager mode; forward hooks would not fire")
        self.compilation = str(mode)
        log(f"vllm {self.version}: engine up in {self.startup_s:.1f}s, "
            f"kv blocks {self.kv_blocks}x{self.block_size}")

    def info(self) -> dict:
        return {"backend": "vllm", "backend_version": self.version, "eager": self.eager,
                "engine_args": {k: _shareable(_plain(v)) for k, v in self.engine_args.items() if k != "model"},
                "compilation_mode": self.compilation, "kv_blocks": self.kv_blocks,
                "kv_block_size": self.block_size, "model_runner": "v1",
                "executor": self.executor,
                "env": {k: os.environ.get(k) for k in ("VLLM_CPU_KVCACHE_SPACE",
                                                        "VLLM_CPU_OMP_THREADS_BIND",
                                                        "VLLM_ENABLE_V1_MULTIPROCESSING")}}

    def run(self, requests, sampling, on_finished, on_steps, flush_every_s=20.0, flush_n=32):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            temperature=sampling["temperature"], top_p=sampling["top_p"],
            repetition_penalty=sampling["repetition_penalty"], max_tokens=sampling["max_tokens"],
            output_kind=RequestOutputKind.DELTA, detokenize=False,
        )
        queue = deque(requests)
        live: dict[str, dict] = {}
        done: list[dict] = []
        vecs: dict[str, dict[int, np.ndarray]] = {}
        ids: dict[str, str] = {}  # engine-internal id -> our request id
        dec: dict[str, list] = {}
        last_flush = time.perf_counter()
        t_run0 = time.perf_counter()
        total = len(requests)
        n_done = 0
        gen_tokens = 0

        def submit():
            while queue and len(live) < self.window:
                req: GenRequest = queue.popleft()
                self._submit(req, params, live, ids)

        def fetch():
            got = self.engine.collective_rpc("ct_fetch")[0]
            for layer, blob in got["last"].items():
                mat = np.frombuffer(blob["data"], dtype=np.float32).reshape(-1, blob["dim"])
                for j, rid in enumerate(blob["ids"]):
                    ext = ids.get(rid, rid)
                    vecs.setdefault(ext, {}).setdefault(int(layer), mat[j])
            if got["dec"]:
                d = got["dec"]
                mat = np.frombuffer(d["data"], dtype=np.float32).reshape(-1, d["dim"])
                for j, rid in enumerate(d["ids"]):
                    dec.setdefault(ids.get(rid, rid), []).append((d["gen"][j], d["layer"][j], mat[j]))
            if got["steps"]:
                on_steps(got["steps"])

        def flush():
            nonlocal done
            if not done:
                fetch()
                return
            fetch()
            out = []
            for st in done:
                rid = st["req"].request_id
                ids.pop(st["internal"], None)
                v = vecs.pop(rid, {})
                missing = [k for k in self.last_layers if k not in v]
                if missing:
                    raise CaptureError(
                        f"vLLM capture missed the last-prompt-token state of {rid} at layer(s) "
                        f"{missing}; refusing to write an incomplete trace")
                out.append(Finished(
                    request=st["req"], output_tokens=st["n"], finish_reason=st["finish"],
                    token_times_s=st["times"], last={k: v[k] for k in self.last_layers},
                    decode=sorted(dec.pop(rid, []), key=lambda x: (x[1], x[0])),
                    arrival_s=st["t0"] - t_run0))
            done = []
            on_finished(out)

        submit()
        while live or queue:
            tokens, finished = self._step(live, done)
            now = time.perf_counter()
            gen_tokens += tokens
            n_done += finished
            submit()
            if done and (len(done) >= flush_n or now - last_flush > flush_every_s):
                flush()
                last_flush = now
                el = now - t_run0
                self.log(f"  {n_done}/{total} done, {gen_tokens / el:.1f} gen tok/s, "
                         f"{len(live)} running")
        flush()
        return {"wall_s": time.perf_counter() - t_run0, "generated_tokens": gen_tokens}

    def serve(self, schedule, on_finished, on_steps, flush_every_s=20.0, flush_n=32,
              on_submit=None):
        """Open loop: submit each request when the clock passes its planned offset.

        ``schedule`` is a list of ``(planned_s, GenRequest, SamplingParams)`` sorted by
        planned_s. A request is submitted between engine steps, at the first step boundary after
        its planned time (as a server's engine core picks up new requests), so the actual
        submission offset (``Finished.arrival_s``) can trail the plan by up to one step. With
        nothing in the engine the loop sleeps until the next arrival (never spins). Token times
        are offsets from the request's own submission. Returns the run's wall time, generated
        tokens and the submission lag.
        """
        ids: dict[str, str] = {}
        live: dict[str, dict] = {}
        done: list[dict] = []
        pending = deque(schedule)
        t0 = time.perf_counter()
        self.engine.collective_rpc("ct_reset_clock")
        t0 = time.perf_counter()
        gen_tokens = 0
        lags: list[float] = []
        last_flush = t0
        total, n_done = len(schedule), 0

        def flush():
            nonlocal done
            got = self.engine.collective_rpc("ct_fetch")[0]
            if got["steps"]:
                on_steps(got["steps"])
            if not done:
                return
            out = [Finished(request=st["req"], output_tokens=st["n"], finish_reason=st["finish"],
                            token_times_s=st["times"], last={}, arrival_s=st["t0"] - t0,
                            step_marks={k: st[k] for k in STEP_MARKS})
                   for st in done]
            for st in done:
                ids.pop(st["internal"], None)
            done = []
            on_finished(out)

        executed = 0            # engine steps run so far: the seconds clock's step numbers
        while pending or live:
            now = time.perf_counter()
            while pending and pending[0][0] <= now - t0:
                planned, req, params = pending.popleft()
                t = self._submit(req, params, live, ids, executed)
                lags.append(t - t0 - planned)
                if on_submit is not None:
                    on_submit(req.request_id, planned, t - t0)
            if not live:
                if pending:
                    time.sleep(max(0.0, pending[0][0] - (time.perf_counter() - t0)))
                continue
            tokens, finished = self._step(live, done, executed)
            executed += 1
            now = time.perf_counter()
            gen_tokens += tokens
            n_done += finished
            if done and (len(done) >= flush_n or now - last_flush > flush_every_s):
                flush()
                last_flush = now
                self.log(f"  {n_done}/{total} done, {len(live)} in the engine, "
                         f"{len(pending)} to arrive, t={now - t0:.0f}s")
        flush()
        return {"wall_s": time.perf_counter() - t0, "generated_tokens": gen_tokens,
                "submit_lag_s": lags, "steps": executed}

    def serve_steps(self, schedule, on_finished, on_steps, flush_every_s=20.0, flush_n=32):
        """Step clock (docs/semantics.md "Step clock"): ``schedule`` is a list of
        ``(arrival_step, GenRequest, SamplingParams)`` sorted by step. Ticks are numbered 0, 1, ...;
        the requests of step k are added (in schedule order) just before tick k's engine step, so
        step k's scheduling decision sees them. A tick with nothing in the engine runs no engine
        step: the clock jumps to the next arrival step (the idle ticks still count). Host speed
        changes no decision, only the wall times beside them. Returns wall time, generated
        tokens, ticks (the clock at the end) and engine steps run."""
        if self._scheduler() is None:
            raise CaptureError("the step clock reads admissions from the engine core's scheduler: "
                               "it needs the engine core in this process (--executor uni)")
        ids: dict[str, str] = {}
        live: dict[str, dict] = {}
        done: list[dict] = []
        pending = deque(schedule)
        self.engine.collective_rpc("ct_reset_clock")
        t0 = time.perf_counter()
        gen_tokens = executed = tick = n_done = 0
        last_flush = t0

        def flush():
            nonlocal done
            got = self.engine.collective_rpc("ct_fetch")[0]
            if got["steps"]:
                on_steps(got["steps"])
            if done:
                fins = [Finished(request=st["req"], output_tokens=st["n"], finish_reason=st["finish"],
                                 token_times_s=st["times"], last={}, arrival_s=st["t0"] - t0,
                                 step_marks={k: st[k] for k in STEP_MARKS}) for st in done]
                done = []
                on_finished(fins)

        while pending or live:
            if not live and pending[0][0] > tick:
                tick = int(pending[0][0])           # idle ticks: no engine step to run
            self._give_tick(tick)
            while pending and pending[0][0] <= tick:
                step, req, params = pending.popleft()
                if step < tick:
                    raise RuntimeError(f"internal: request {req.request_id} due at step {step} "
                                       f"submitted at step {tick}")
                self._submit(req, params, live, ids, tick)
            tokens, finished = self._step(live, done, tick)
            tick += 1
            executed += 1
            gen_tokens += tokens
            n_done += finished
            now = time.perf_counter()
            if done and (len(done) >= flush_n or now - last_flush > flush_every_s):
                flush()
                last_flush = now
                self.log(f"  {n_done}/{len(schedule)} done, {len(live)} in the engine, "
                         f"{len(pending)} to arrive, step {tick}")
        flush()
        return {"wall_s": time.perf_counter() - t0, "generated_tokens": gen_tokens,
                "ticks": tick, "steps": executed}

    def saturated_capacity(self, requests, params_for, max_resident):
        """Live saturated capacity: every request queued at t = 0; completions per second over
        the saturated window, which ends when fewer than ``max_resident`` requests remain
        unfinished (the drain tail, where the engine runs below its cap, is excluded). With no
        more requests than the cap the engine never saturates and the whole makespan counts
        (``saturated: false``)."""
        t0 = time.perf_counter()
        live = set()
        for req in requests:
            self.engine.add_request(req.request_id, {"prompt_token_ids": req.prompt_token_ids},
                                    params_for(req), **req.fields)
            live.add(req.request_id)
        n = len(requests)
        finish_t: list[float] = []
        finish_step: list[int] = []
        gen_tokens = step = 0
        while live:
            outs = self.engine.step()
            now = time.perf_counter() - t0
            for o in outs:
                if o.request_id not in live:
                    continue
                gen_tokens += len(o.outputs[0].token_ids)
                if o.finished:
                    live.discard(o.request_id)
                    finish_t.append(now)
                    finish_step.append(step)
            step += 1
        steps = self.engine.collective_rpc("ct_fetch")[0]["steps"]  # not part of any trace
        saturated = n > max_resident
        k = n - max_resident + 1 if saturated else n  # completions when fewer than the cap remain
        window = finish_t[k - 1]
        window_steps = finish_step[k - 1] + 1          # steps 0 .. the k-th completion's step
        return {"capacity_req_s": k / window, "saturated": saturated, "window_s": window,
                "capacity_req_per_step": k / window_steps, "window_steps": window_steps,
                "completions_in_window": k, "requests": n, "makespan_s": finish_t[-1],
                "makespan_steps": finish_step[-1] + 1,
                "generated_tokens": gen_tokens, "steps": step_summary(steps)}

    def _submit(self, req, params, live: dict, ids: dict, step: int | None = None) -> float:
        """Add one request to the engine (before engine step ``step``); its state (submission time
        ``t0``, step marks) goes into ``live``, the engine's internal id into ``ids``. Returns the
        submission time."""
        t = time.perf_counter()
        internal = self.engine.add_request(req.request_id, {"prompt_token_ids": req.prompt_token_ids}, params,
                                           **req.fields)
        ids[internal if isinstance(internal, str) else req.request_id] = req.request_id
        live[req.request_id] = {"req": req, "t0": t, "times": [], "n": 0, "internal": internal,
                                **dict.fromkeys(STEP_MARKS), "arrival_step": step}
        return t

    def _give_tick(self, tick: int) -> None:
        """The step clock's tick to the project's scheduler (``LeapScheduler.leap_set_tick``), before
        the tick's submissions and engine step: its policies' clock is then in ticks, as in the replay."""
        set_tick = getattr(self._scheduler(), "leap_set_tick", None)
        if set_tick is not None:
            set_tick(tick)

    def _scheduler(self):
        """The engine core's scheduler where it runs in this process (uni executor), else None."""
        return getattr(getattr(getattr(self.engine, "engine_core", None), "engine_core", None),
                       "scheduler", None)

    def _step(self, live: dict, done: list, step: int | None = None) -> tuple[int, int]:
        """One engine step (number ``step``): each output's tokens stamped (offset from its
        request's submission), its step marks set, finished requests moved from ``live`` to
        ``done``; returns (tokens, finished)."""
        outs = engine_step_holding_ctrl_c(self.engine)
        now = time.perf_counter()
        sched = self._scheduler() if step is not None else None
        tokens = finished = 0
        for o in outs:
            st = live.get(o.request_id)
            if st is None:
                continue
            c = o.outputs[0]
            k = len(c.token_ids)
            if k:
                st["times"].extend([now - st["t0"]] * k)
                st["n"] += k
                tokens += k
                if st["first_token_step"] is None:
                    st["first_token_step"] = step
                    if st["admit_step"] is None and sched is not None:  # admitted in this very step
                        st["admit_step"] = step
            if o.finished:
                st["finish"] = "length" if c.finish_reason == "length" else "stop"
                st["finish_step"] = step
                done.append(live.pop(o.request_id))
                finished += 1
        if sched is not None and step is not None:
            _mark_admitted(live, sched.requests, step)
        return tokens, finished

    def close(self):
        try:
            self.engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001
            pass


def _mark_admitted(live: dict, requests: dict, step: int) -> None:
    """``admit_step`` of each request whose first prefill tokens were scheduled in this step: the
    engine's scheduler (``requests``: its requests by internal id) has computed tokens for it now
    and had none after the step before (a preempted request's re-prefill does not count: only the
    first admission is recorded)."""
    for st in live.values():
        if st["admit_step"] is None:
            r = requests.get(st["internal"])
            if r is not None and r.num_computed_tokens > 0:
                st["admit_step"] = step


def step_summary(steps: list[dict]) -> dict:
    """Decode-only steps (no prefill): step time against decoded requests (least squares
    step_s = a + b x decode_requests + c x decode_context), and the drift probe's spread."""
    dec = [s for s in steps if s["prefill_tokens"] == 0 and s["decode_requests"] > 0]
    out: dict = {"steps": len(steps), "decode_only_steps": len(dec)}
    if len(dec) >= 3:
        n = np.array([s["decode_requests"] for s in dec], dtype=float)
        ctx = np.array([s["decode_context"] for s in dec], dtype=float)
        t = np.array([s["step_s"] for s in dec])
        coef = np.linalg.lstsq(np.c_[np.ones_like(n), n, ctx], t, rcond=None)[0]
        full = n == n.max()
        out.update({"median_step_s_per_decoded_request": float(np.median(t / n)),
                    "median_step_s_at_most_decodes": float(np.median(t[full])),
                    "most_decodes": int(n.max()),
                    "fit_s": {"intercept": float(coef[0]), "per_request": float(coef[1]),
                              "per_context_token": float(coef[2])}})
    probes = np.array([s["probe_s"] for s in steps if s.get("probe_s") is not None])
    if len(probes):
        out["probe"] = {"n": int(len(probes)), "median_s": float(np.median(probes)),
                        "p10_s": float(np.quantile(probes, 0.1)), "p90_s": float(np.quantile(probes, 0.9)),
                        "cv": float(probes.std() / probes.mean())}
    return out


def _plain(value):
    """JSON-safe engine argument (a class given as scheduler_cls -> its dotted name)."""
    if value is None or isinstance(value, (str, int, float, bool, list, dict)):
        return value
    name = getattr(value, "__qualname__", None)
    return f"{value.__module__}.{name}" if name else repr(value)


def _shareable(value):
    """An engine argument with every absolute file path in it (e.g. a live config's read-out)
    named as ``core.io.shareable_path`` does: no machine path in a shared trace."""
    if isinstance(value, dict):
        return {k: _shareable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shareable(v) for v in value]
    if isinstance(value, str) and os.path.isabs(value) and os.path.isfile(value):
        from core.io import shareable_path
        return shareable_path(value)
    return value


def parse_cpu_list(text: str, local: bool = True) -> list[int]:
    """CPU ids from a list such as "0", "0-1" or "0,2-3" (the VLLM_CPU_OMP_THREADS_BIND format);
    ``local``: they must be among this process's CPUs (False for another process's binding, e.g. a
    server's, which this process may be pinned away from)."""
    cpus: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise CaptureError(f"--threads {text!r}: expected CPU ids such as 0, 0-1 or 0,2-3") from None
    if not cpus or (local and not set(cpus) <= os.sched_getaffinity(0)):
        raise CaptureError(f"--threads {text!r}: CPUs must be among {sorted(os.sched_getaffinity(0))}")
    return sorted(set(cpus))


def engine_step_holding_ctrl_c(engine):
    """``engine.step()`` with Ctrl-C held until the step returns, then raised: vLLM turns an
    exception raised inside its step into a failed engine (an error, not an interruption), so the
    interruption lands between steps and the run's parts stay resumable. A second Ctrl-C during the
    same step raises at once. A plain step outside the main thread (no signal handlers there) and
where SIGINT is not Python's KeyboardInterrupt (ignored, as under ``nohup ... &``, or handled)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return engine.step()   # no handler here, or Ctrl-C ignored / handled by someone else
    pressed: list[int] = []

    def hold(signum, frame):
        if pressed:
            raise KeyboardInterrupt
        pressed.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        outs = engine.step()
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt
    return outs
