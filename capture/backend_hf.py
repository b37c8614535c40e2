"""transformers fallback backend: static batches, left padding, batched ``generate``.

Same hook semantics as the vLLM backend: layer k = output of decoder block k (HF
``hidden_states[k+1]``).  The first forward of a batch is the prefill: its row at the last position
is the last prompt token of every (left-padded) prompt.  Each later forward is one decode step s
(1-based) whose input is generated token s, so its state is recorded as generated_tokens = s when
s % decode_every == 0 (only for rows still generating).  Timings come from forward pre/post hooks
on the model (one engine step per forward); ``kv_usage`` is null (no paged KV cache).
Structurally unlike vLLM: no continuous batching and no chunked prefill.
"""

from __future__ import annotations

import time

import numpy as np

from .backend import Backend, Finished
from .model import load_causal_lm


class HFBackend(Backend):
    name = "transformers"

    def __init__(self, model_dir, *, last_layers, decode_layers, decode_every, dtype="float32",
                 seed=0, batch_size=16, threads=None, log=print):
        import torch
        import transformers
        from transformers import AutoTokenizer

        if threads:
            torch.set_num_threads(int(threads))
        self.torch = torch
        self.version = transformers.__version__
        self.dtype = dtype
        self.seed = seed
        self.batch_size = batch_size
        self.log = log
        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = load_causal_lm(model_dir, getattr(torch, dtype))
        self.eos = self.model.generation_config.eos_token_id
        if isinstance(self.eos, int):
            self.eos = [self.eos]
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos[0]
        self.last_layers = list(last_layers)
        self.decode_layers = list(decode_layers)
        self.every = int(decode_every or 0)
        layers = self.model.model.layers
        self._hooks = []
        for k in sorted(set(self.last_layers) | set(self.decode_layers)):
            self._hooks.append(layers[k].register_forward_hook(self._mk(k)))
        self._hooks.append(self.model.register_forward_pre_hook(self._pre))
        self._hooks.append(self.model.register_forward_hook(self._post))
        self._reset()

    def _reset(self):
        self._call = -1
        self._last = {}
        self._dec = []
        self._steps: list[dict] = []
        self._t = 0.0                   # set by _pre before each forward
        self._t0 = 0.0                  # set when a batch starts
        self._batch_real = 0

    def _pre(self, mod, args, kwargs=None):
        self._call += 1
        self._t = time.perf_counter()

    def _post(self, mod, args, out):
        t = time.perf_counter()
        ids = self._cur_ids
        if self._call == 0:
            self._steps.append({"wall_start_s": self._t - self._t0, "step_s": t - self._t,
                                "prefill_requests": len(ids), "prefill_tokens": int(self._batch_real),
                                "decode_requests": 0, "decode_tokens": 0, "kv_usage": None})
        else:
            live = int(np.sum(self._alive(self._call)))
            self._steps.append({"wall_start_s": self._t - self._t0, "step_s": t - self._t,
                                "prefill_requests": 0, "prefill_tokens": 0,
                                "decode_requests": live, "decode_tokens": live, "kv_usage": None})
        self._step_end.append(t)

    def _alive(self, s):
        # unknown lengths during generation: a row is alive until it emitted EOS (tracked by stopper)
        return self._running_mask

    def _mk(self, k):
        def hook(mod, args, out):
            h = out[0] if isinstance(out, tuple) else out
            if self._call == 0:
                if k in self.last_layers:
                    self._last[k] = h[:, -1, :].detach().float().clone()
            elif self.every and k in self.decode_layers and self._call % self.every == 0:
                self._dec.append((self._call, k, h[:, -1, :].detach().float().clone()))
        return hook

    def info(self) -> dict:
        return {"backend": "transformers", "backend_version": self.version, "eager": True,
                "batch_size": self.batch_size, "padding": "left", "dtype": self.dtype,
                "threads": self.torch.get_num_threads()}

    def run(self, requests, sampling, on_finished, on_steps, *, flush_n: int = 32):
        torch = self.torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        torch.manual_seed(self.seed)
        M = sampling["max_tokens"]
        t_run0 = time.perf_counter()
        gen_total = 0
        backend = self

        class Stopper(StoppingCriteria):
            def __call__(self, input_ids, scores, **kw):
                last = input_ids[:, -1]
                ended = torch.zeros_like(last, dtype=torch.bool)
                for e in backend.eos:
                    ended |= last == e
                backend._running_mask = backend._running_mask & ~ended.numpy()
                return torch.zeros_like(last, dtype=torch.bool)  # let generate handle EOS/M

        for s in range(0, len(requests), self.batch_size):
            batch = requests[s:s + self.batch_size]
            n = len(batch)
            L = max(len(r.prompt_token_ids) for r in batch)
            ids = torch.full((n, L), self.pad, dtype=torch.long)
            mask = torch.zeros((n, L), dtype=torch.long)
            for i, r in enumerate(batch):
                ids[i, L - len(r.prompt_token_ids):] = torch.tensor(r.prompt_token_ids)
                mask[i, L - len(r.prompt_token_ids):] = 1
            self._reset()
            self._cur_ids = [r.request_id for r in batch]
            self._batch_real = int(mask.sum())
            self._running_mask = np.ones(n, dtype=bool)
            self._step_end: list[float] = []
            self._t0 = t_run0
            t_sub = time.perf_counter()
            do_sample = sampling["temperature"] > 0
            kw = dict(do_sample=do_sample, max_new_tokens=M,
                      repetition_penalty=sampling["repetition_penalty"],
                      eos_token_id=self.eos, pad_token_id=self.pad,
                      stopping_criteria=StoppingCriteriaList([Stopper()]))
            if do_sample:
                kw.update(temperature=sampling["temperature"], top_p=sampling["top_p"], top_k=0)
            with torch.inference_mode():
                out = self.model.generate(input_ids=ids, attention_mask=mask, **kw)
            new = out[:, L:].numpy()
            fins = []
            for i, r in enumerate(batch):
                row = new[i]
                stop = np.nonzero(np.isin(row, self.eos))[0]
                if len(stop):
                    k = int(stop[0]) + 1  # the EOS token counts as generated (as in vLLM)
                    reason = "stop"
                else:
                    k = int(len(row))
                    reason = "length" if k >= M else "stop"
                times = [self._step_end[j] - t_sub for j in range(min(k, len(self._step_end)))]
                dec = [(g, layer, v[i].numpy()) for g, layer, v in self._dec if g < k]
                fins.append(Finished(request=r, output_tokens=k, finish_reason=reason,
                                     token_times_s=times,
                                     last={layer: self._last[layer][i].numpy()
                                           for layer in self.last_layers},
                                     decode=dec, arrival_s=t_sub - t_run0))
                gen_total += k
            on_steps(self._steps)
            on_finished(fins)
            el = time.perf_counter() - t_run0
            self.log(f"  {min(s + self.batch_size, len(requests))}/{len(requests)} done, "
                     f"{gen_total / el:.1f} gen tok/s")
        return {"wall_s": time.perf_counter() - t_run0, "generated_tokens": gen_total}

    def close(self):
        for h in self._hooks:
            h.remove()
