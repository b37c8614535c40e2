"""vLLM worker extension: LEAP's read-out applied after the forward, at the end of prefill.

Loaded by ``worker_extension_cls="live.worker_ext.LiveExt"`` (vLLM appends it to the Worker's
bases). It extends :class:`capture.vllm_ext.CaptureExt` (so the capture methods and step timer stay
available to a serving-run driver) with ``lv_tap`` and ``lv_install``. ``lv_tap`` (called by the
worker's own ``load_model`` once the model is loaded, before vLLM traces it: ``LiveExt.__new__``, in
every worker process of any executor)
puts LEAP's tap on decoder layer k (:mod:`live.tap`): a custom op inside the layer's forward that writes the residual
stream of every row of the step (``out[0] + out[1]``, the capture hook's row arithmetic) into a
static buffer, in compiled and eager mode alike. ``lv_install`` adds a forward hook on the top-level
model (plain Python around the compiled decoder stack): in the step whose chunk holds a request's
last prompt token it takes that token's row from the buffer and applies the read-out's folded
float32 weights on the model's device: lin = x . w + b, clip, square. The results (and, for
leap-rls, the raw vectors) go to a :class:`PredictionChannel`.

Channel choice: with the in-process ``uni`` executor, ``collective_rpc`` calls the worker method
directly, so the scheduler passes its own channel object to ``lv_install`` (``live.attach``). One
channel per engine, owned by that engine's scheduler: no module global, no serialisation. The mp
executor serialises the channel: with tensor parallel > 1 the served plugin passes a file channel's
writer instead (``live.tp_channel``, ``leap_sched.vllm.tp``); ``live.attach`` refuses the mp executor.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from capture.vllm_ext import CaptureExt, query_starts
from live.common import LiveConfigError
from live.tap import configured_layer, install_tap, tapped_layer


class PredictionChannel:
    """Hook -> scheduler hand-off in one process: batches of (engine ids, predictions, vectors).

    The hook appends a batch per prefill step (device tensors, no sync inside the forward); the
    scheduler drains at the next step start, after the step's outputs were synchronised.
    ``hook_s`` accumulates the hook's wall time (every forward, decode-only steps included).
    """

    def __init__(self) -> None:
        self.pending: deque = deque()
        self.hook_s = 0.0
        self.hook_calls = 0
        self.installed = False
        self.seen: set[str] = set()     # engine ids predicted; the scheduler drops finished ones
        self.layer: int | None = None

    def forget_finished(self, live) -> None:
        """Bound ``seen`` by the runner's live requests (``live``): here the scheduler discards finished
        ids itself; a cross-process channel's worker side (live.tp_channel) prunes."""

    def take_hook_s(self) -> float:
        t, self.hook_s = self.hook_s, 0.0
        return t

    def drain(self) -> list[tuple[list[str], np.ndarray, np.ndarray | None]]:
        out = []
        while self.pending:
            ids, pred, vec = self.pending.popleft()
            out.append((ids, pred.double().cpu().numpy(),
                        None if vec is None else vec.cpu().numpy()))
        return out


class LiveExt(CaptureExt):
    load_model: Callable[..., None]    # the Worker's (this class is one of its bases): wrapped by __new__

    def __new__(cls, *args, **kwargs):
        """vLLM builds the Worker (whose bases end with this class) with keyword arguments and the Worker
        defines no ``__new__``, so this runs in every worker process, in-process or vLLM's ``mp``: when
        ``vllm_config`` names a read-out, the worker's ``load_model`` taps its layer right after loading,
        before the memory profile's first forward (the one torch.compile traces)."""
        self = super().__new__(cls)
        config = getattr(kwargs.get("vllm_config"), "additional_config", None)
        load = getattr(self, "load_model", None)
        if load is None or not isinstance(config, dict):
            return self

        def load_model(*a, **kw):
            load(*a, **kw)
            try:
                layer = configured_layer(config)
            except LiveConfigError:
                return                     # the scheduler refuses the settings with its one line
            if layer is not None:
                self.lv_tap(layer)

        self.load_model = load_model
        return self

    def lv_tap(self, layer: int) -> dict:
        """Tap decoder ``layer`` (before the model's first forward: vLLM traces the model once)."""
        r = self.model_runner
        install_tap(r.model, int(layer), int(self.vllm_config.scheduler_config.max_num_batched_tokens))
        return {"layer": int(layer), "compiled": not self.vllm_config.model_config.enforce_eager}

    def lv_install(self, channel: PredictionChannel, layer: int, folded: tuple, keep_vectors: bool):
        """Read the tap of decoder ``layer``; ``folded`` = (w float32 (d,), b, lo, hi, square, cap)."""
        r = self.model_runner
        layers = r.model.get_submodule("model.layers")
        if not 0 <= int(layer) < len(layers):
            raise ValueError(f"layer {layer} out of range: the model has {len(layers)} decoder layers")
        tap = tapped_layer(r.model)
        if tap is None or tap[0] != int(layer):
            raise ValueError(f"decoder layer {layer} carries no LEAP tap: the engine's additional_config must name "
                             "this read-out, so that each worker taps its layer at load, before vLLM traces the model")
        w, b, lo, hi, square, cap = folded
        if not square:
            raise ValueError("the live hook applies the sqrt-target read-out only (python -m live.readout)")
        hidden = int(getattr(r.model_config.hf_config, "hidden_size", -1))
        if hidden != len(w):
            raise ValueError(f"read-out has {len(w)} weights, the model's hidden size is {hidden}")
        tp = self.parallel_config.tensor_parallel_size
        self._lv_active = tp <= 1 or self.rank % tp == 0
        self._lv_w: torch.Tensor | None = None
        self._lv_params = (np.asarray(w, dtype=np.float32), float(b), float(lo), float(hi), bool(square),
                           float(cap))
        self._lv_keep = bool(keep_vectors)
        self._lv_channel = channel
        self._lv_buffer = tap[1]
        self._lv_handle = r.model.register_forward_hook(self._lv_hook)
        channel.installed = True
        channel.layer = int(layer)
        return {"layer": int(layer), "num_layers": len(layers), "hidden_size": hidden,
                "compiled": not self.vllm_config.model_config.enforce_eager}

    def _lv_hook(self, mod, args, out):
        if not self._lv_active:
            return
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return
        t0 = time.perf_counter()
        ch = self._lv_channel
        try:
            r = self.model_runner
            ib = r.input_batch
            n = ib.num_reqs
            if n == 0:
                return
            ch.hook_calls += 1
            qsl = query_starts(r, n)
            off = (np.asarray(ib.num_prompt_tokens[:n], dtype=np.int64) - 1
                   - np.asarray(ib.num_computed_tokens_cpu[:n], dtype=np.int64))
            sel = np.nonzero((off >= 0) & (off < np.diff(qsl)))[0]
            if len(sel) == 0:
                return                                  # decode-only step: numpy only, no device work
            ids = [ib.req_ids[i] for i in sel.tolist()]
            fresh = [j for j, rid in enumerate(ids) if rid not in ch.seen]   # not a preemption re-prefill
            if not fresh:
                return
            sel, ids = sel[fresh], [ids[j] for j in fresh]
            ch.forget_finished(r.requests)
            ch.seen.update(ids)
            vec = self._lv_buffer.rows(qsl[sel] + off[sel])
            if self._lv_w is None or self._lv_w.device != vec.device:
                self._lv_w = torch.from_numpy(self._lv_params[0]).to(vec.device)
            _, b, lo, hi, square, cap = self._lv_params
            value = torch.clamp(vec @ self._lv_w + b, lo, hi)
            value = value * value
            ch.pending.append((ids, torch.clamp(value, 1.0, cap), vec if self._lv_keep else None))
        finally:
            ch.hook_s += time.perf_counter() - t0
