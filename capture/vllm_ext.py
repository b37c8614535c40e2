"""vLLM worker extension: forward hooks that capture hidden states, plus a per-step timer.

Loaded inside vLLM's worker process via ``worker_extension_cls="capture.vllm_ext.CaptureExt"``
(vLLM appends the class to the Worker's bases, so ``self.model_runner`` etc. exist).  Methods are
prefixed ``ct_`` so they cannot clash with Worker attributes.  Only plain types cross the RPC
boundary (lists, ints, floats, bytes).

Semantics (V1 model runner, vLLM 0.8.5 .. 0.32):
  * layer k = output of decoder block k (0-based) = residual stream = out[0] + out[1] for vLLM's
    fused-residual Llama layers = HF ``hidden_states[k+1]``.
  * last-prompt-token vector: the flattened row ``qsl[i] + (num_prompt_tokens[i]-1-num_computed[i])``
    of the step whose chunk contains position prompt_len-1 (works with chunked prefill and prefix
    caching); the first capture per request is kept (preemption re-prefills are ignored).
  * decode vectors: for decode rows (one scheduled token at position p >= prompt_len) the hidden
    state of the input token at p, i.e. after ``generated_tokens = p - prompt_len + 1`` tokens were
    generated; sampled when generated_tokens % every == 0.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

PROBE_N = 192
PROBE_REPS = 2
#: Memory probe: a reduction over a buffer twice the recording box's 32 MiB L3, so it streams from
#: DRAM like the model's weights do and slows with the other cores' memory traffic, which the
#: in-cache matmul probe does not see. Run every ``probe_every * PROBE_MEM_EVERY`` steps (it costs
#: a few ms).
PROBE_MEM_ELEMENTS = 16 * 2**20          # float32: 64 MiB
PROBE_MEM_EVERY = 4


def query_starts(runner, n: int) -> np.ndarray:
    """The step's flattened-row offset of each of its ``n`` requests (``n + 1`` values), from the V1
    model runner: ``query_start_loc_np`` in vLLM 0.8.5, ``query_start_loc.np`` in current vLLM."""
    qsl = getattr(runner, "query_start_loc_np", None)
    if qsl is None:
        qsl = runner.query_start_loc.np
    return np.asarray(qsl[: n + 1], dtype=np.int64)


def run_probe(a: torch.Tensor) -> float:
    """Seconds for ``PROBE_REPS`` fixed matmuls (~1 ms on one core of the recording box)."""
    t = time.perf_counter()
    for _ in range(PROBE_REPS):
        torch.mm(a, a)
    return time.perf_counter() - t


def run_mem_probe(buf: torch.Tensor) -> float:
    """Seconds for one sum over ``buf`` (larger than the L3: a DRAM-bandwidth probe)."""
    t = time.perf_counter()
    buf.sum()
    return time.perf_counter() - t


def mem_probe_buffer() -> torch.Tensor:
    return torch.ones(PROBE_MEM_ELEMENTS, dtype=torch.float32)


class CaptureExt:
    # vLLM mixes this class into its worker (``worker_extension_cls``), which provides these
    model_runner: Any
    vllm_config: Any
    parallel_config: Any
    cache_config: Any
    rank: int

    # ------------------------------------------------------------------ setup
    def ct_install(self, last_layers, decode_layers, decode_every, probe_every=0):
        r = self.model_runner
        layers = r.model.get_submodule("model.layers")
        self._ct_num_layers = len(layers)
        self._ct_last_layers = [int(x) for x in last_layers]
        self._ct_dec_layers = [int(x) for x in decode_layers]
        self._ct_every = int(decode_every) if decode_every else 0
        self._ct_last: dict[int, dict] = {k: {} for k in self._ct_last_layers}
        self._ct_dec: list[tuple] = []  # (req_id, generated_tokens, layer, tensor)
        self._ct_steps: list[dict] = []
        self._ct_calls = 0
        self._ct_stepinfo = None
        tp = self.parallel_config.tensor_parallel_size
        self._ct_capture = tp <= 1 or self.rank % tp == 0
        try:
            self._ct_block_size = int(self.cache_config.block_size)
            self._ct_num_blocks = int(self.cache_config.num_gpu_blocks or 0)
        except Exception:  # noqa: BLE001
            self._ct_block_size, self._ct_num_blocks = 0, 0
        self._ct_probe_every = int(probe_every or 0)
        self._ct_probe_in = torch.full((PROBE_N, PROBE_N), 0.5, dtype=torch.float32)
        self._ct_probe_mem = mem_probe_buffer() if self._ct_probe_every else None   # allocated once
        self._ct_nsteps = 0
        self._ct_handles = []
        hooked = sorted(set(self._ct_last_layers) | set(self._ct_dec_layers))
        for k in hooked or [0]:  # no capture layers (serving runs): layer 0 for the step rows only
            self._ct_handles.append(layers[k].register_forward_hook(self._ct_make_hook(k)))
        # Step timer: wrap execute_model (and sample_tokens when the runner splits them).
        self._ct_t0 = time.perf_counter()
        self._ct_pending = None
        orig_exec = r.execute_model
        orig_sample = getattr(r, "sample_tokens", None)
        ext = self

        def execute_model(*a, **kw):
            ext._ct_stepinfo = None
            t = time.perf_counter()
            out = orig_exec(*a, **kw)
            if out is None and orig_sample is not None:
                ext._ct_pending = t  # finished by sample_tokens
            else:
                ext._ct_record_step(t)
            return out

        r.execute_model = execute_model
        if orig_sample is not None:
            def sample_tokens(*a, **kw):
                out = orig_sample(*a, **kw)
                if ext._ct_pending is not None:
                    ext._ct_record_step(ext._ct_pending)
                    ext._ct_pending = None
                return out

            r.sample_tokens = sample_tokens
        return {"num_layers": self._ct_num_layers, "block_size": self._ct_block_size,
                "num_blocks": self._ct_num_blocks}

    def _ct_record_step(self, t_start):
        info = self._ct_stepinfo
        self._ct_stepinfo = None
        if info is None:
            return  # no forward ran (empty / dummy step)
        t_end = time.perf_counter()
        info["wall_start_s"] = t_start - self._ct_t0
        info["step_s"] = t_end - t_start
        info["probe_s"] = None
        if self._ct_probe_every and self._ct_nsteps % self._ct_probe_every == 0:
            info["probe_s"] = run_probe(self._ct_probe_in)
        info["probe_mem_s"] = None
        if self._ct_probe_every and self._ct_probe_mem is not None \
                and self._ct_nsteps % (self._ct_probe_every * PROBE_MEM_EVERY) == 0:
            info["probe_mem_s"] = run_mem_probe(self._ct_probe_mem)
        self._ct_nsteps += 1
        self._ct_steps.append(info)

    def ct_reset_clock(self):
        """Make ``wall_start_s`` count from now (a serving run's start); drops buffered steps."""
        self._ct_t0 = time.perf_counter()
        self._ct_steps = []
        return self._ct_t0

    # ------------------------------------------------------------------ hook
    def _ct_make_hook(self, layer):
        is_last = layer in self._ct_last
        is_dec = layer in self._ct_dec_layers and self._ct_every > 0
        hook_layers = sorted(set(self._ct_last_layers) | set(self._ct_dec_layers)) or [0]
        is_first = layer == hook_layers[0]

        def hook(mod, args, out):
            if not self._ct_capture:
                return
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return
            r = self.model_runner
            ib = r.input_batch
            n = ib.num_reqs
            if n == 0:
                return
            self._ct_calls += 1
            qsl = query_starts(r, n)
            qlen = np.diff(qsl)
            nprompt = np.asarray(ib.num_prompt_tokens[:n], dtype=np.int64)
            ncomp = np.asarray(ib.num_computed_tokens_cpu[:n], dtype=np.int64)
            if self._ct_stepinfo is None and is_first:
                pre = ncomp < nprompt
                dec_rows = ~pre & (qlen > 0)
                pre_len = np.where(pre, qlen, 0)
                bs = self._ct_block_size
                kv = float("nan")
                if bs and self._ct_num_blocks:
                    kv = float(np.sum((ncomp + qlen + bs - 1) // bs)) / self._ct_num_blocks
                self._ct_stepinfo = {
                    "prefill_requests": int(np.sum(pre & (qlen > 0))),
                    "prefill_tokens": int(np.sum(np.where(pre, qlen, 0))),
                    "decode_requests": int(np.sum(~pre & (qlen > 0))),
                    "decode_tokens": int(np.sum(np.where(~pre, qlen, 0))),
                    "kv_usage": kv,
                    "decode_context": int(np.sum(np.where(dec_rows, ncomp + qlen, 0))),
                    "prefill_sq": int(np.sum(pre_len * (ncomp + pre_len))),
                }
            hs, res = out if isinstance(out, tuple) else (out, None)
            rows_parts: list[np.ndarray] = []
            tags: list[tuple[str, int, int]] = []
            if is_last:
                off = nprompt - 1 - ncomp
                sel = np.nonzero((off >= 0) & (off < qlen))[0]
                if len(sel):
                    rows_parts.append(qsl[sel] + off[sel])
                    tags.extend(("L", int(i), 0) for i in sel)
            if is_dec:
                gen = ncomp - nprompt + 1
                sel = np.nonzero((qlen == 1) & (gen > 0) & (gen % self._ct_every == 0))[0]
                if len(sel):
                    rows_parts.append(qsl[sel])
                    tags.extend(("D", int(i), int(gen[i])) for i in sel)
            if not rows_parts:
                return
            rows = torch.from_numpy(np.concatenate(rows_parts))
            idx = rows.to(hs.device, non_blocking=True) if hs.is_cuda else rows
            vec = hs.index_select(0, idx)
            if res is not None:
                vec = vec + res.index_select(0, idx)
            vec = vec.detach()
            ids = ib.req_ids
            buf = self._ct_last.get(layer, {})   # "L" tags only on a last layer
            for j, (kind, i, g) in enumerate(tags):
                rid = ids[i]
                if kind == "L":
                    if rid not in buf:
                        buf[rid] = vec[j]
                else:
                    self._ct_dec.append((rid, g, layer, vec[j]))

        return hook

    # ------------------------------------------------------------------ fetch
    def ct_fetch(self):
        """Drain buffers. Vectors come back as float32 bytes, row-major."""
        out: dict[str, Any] = {"last": {}, "dec": None, "steps": self._ct_steps, "calls": self._ct_calls}
        self._ct_steps = []
        for layer, buf in self._ct_last.items():
            ids = list(buf)
            if ids:
                mat = torch.stack([buf[k] for k in ids]).float().cpu().numpy()
                out["last"][str(layer)] = {"ids": ids, "dim": int(mat.shape[1]),
                                           "data": mat.tobytes()}
            buf.clear()
        if self._ct_dec:
            dec, self._ct_dec = self._ct_dec, []
            mat = torch.stack([d[3] for d in dec]).float().cpu().numpy()
            out["dec"] = {"ids": [d[0] for d in dec], "gen": [d[1] for d in dec],
                          "layer": [d[2] for d in dec], "dim": int(mat.shape[1]),
                          "data": mat.tobytes()}
        return out

    def ct_info(self):
        return {"calls": self._ct_calls, "threads": torch.get_num_threads()}

    def ct_probe(self, reps, memory=False):
        """``reps`` probe timings now (the serving command's quiet-machine reference): a list of
        matmul-probe times, or with ``memory`` a dict of both probes' lists (``probe_s``,
        ``probe_mem_s``)."""
        compute = [run_probe(self._ct_probe_in) for _ in range(int(reps))]
        if not memory:
            return compute
        mem = getattr(self, "_ct_probe_mem", None)
        if mem is None:
            mem = self._ct_probe_mem = mem_probe_buffer()
        run_mem_probe(mem)          # first touch out of the reference
        return {"probe_s": compute, "probe_mem_s": [run_mem_probe(mem) for _ in range(int(reps))]}
