"""vLLM backend: LLMEngine step loop + the CaptureExt worker extension (see capture.vllm_ext).

Must be driven from a ``if __name__ == "__main__":`` guarded entry point (vLLM spawns workers).
"""

from __future__ import annotations

import os
import time
from collections import deque

import numpy as np

from . import CaptureError
from .backend import Backend, Finished, GenRequest


class VLLMBackend(Backend):
    name = "vllm"

    def __init__(self, model_dir, *, last_layers, decode_layers, decode_every, dtype="float32",
                 seed=0, max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=2048,
                 kv_space_gib=4, threads=None, window=None, executor="uni", log=print):
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
        self.executor = executor
        args = EngineArgs(**self.engine_args)
        if not args.enforce_eager:
            raise CaptureError("internal: vLLM capture requires enforce_eager=True")
        t = time.perf_counter()
        self.engine = LLMEngine.from_engine_args(args)
        self.startup_s = time.perf_counter() - t
        info = self.engine.collective_rpc(
            "ct_install", args=(self.last_layers, self.decode_layers, decode_every))[0]
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
                "engine_args": {k: v for k, v in self.engine_args.items() if k != "model"},
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
                t = time.perf_counter()
                internal = self.engine.add_request(
                    req.request_id, {"prompt_token_ids": req.prompt_token_ids}, params)
                ids[internal if isinstance(internal, str) else req.request_id] = req.request_id
                live[req.request_id] = {"req": req, "t0": t, "times": [], "n": 0,
                                        "internal": internal}

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
                    decode=sorted(dec.pop(rid, []), key=lambda x: (x[1], x[0]))))
            done = []
            on_finished(out)

        submit()
        while live or queue:
            outs = self.engine.step()
            now = time.perf_counter()
            for o in outs:
                st = live.get(o.request_id)
                if st is None:
                    continue
                c = o.outputs[0]
                k = len(c.token_ids)
                if k:
                    st["times"].extend([now - st["t0"]] * k)
                    st["n"] += k
                    gen_tokens += k
                if o.finished:
                    st["finish"] = "length" if c.finish_reason == "length" else "stop"
                    done.append(live.pop(o.request_id))
                    n_done += 1
            submit()
            if done and (len(done) >= flush_n or now - last_flush > flush_every_s):
                flush()
                last_flush = now
                el = now - t_run0
                self.log(f"  {n_done}/{total} done, {gen_tokens / el:.1f} gen tok/s, "
                         f"{len(live)} running")
        flush()
        return {"wall_s": time.perf_counter() - t_run0, "generated_tokens": gen_tokens}

    def close(self):
        try:
            self.engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001
            pass


def parse_cpu_list(text: str) -> list[int]:
    """CPU ids from a list such as "0", "0-1" or "0,2-3" (the VLLM_CPU_OMP_THREADS_BIND format)."""
    cpus: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise CaptureError(f"--threads {text!r}: expected CPU ids such as 0, 0-1 or 0,2-3") from None
    if not cpus or not set(cpus) <= os.sched_getaffinity(0):
        raise CaptureError(f"--threads {text!r}: CPUs must be among {sorted(os.sched_getaffinity(0))}")
    return sorted(set(cpus))
