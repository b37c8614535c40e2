"""Torch training of the baseline heads (optional extra ``train``; inference never imports this).

Every trainer is deterministic: ``torch.manual_seed(seed)``, one CPU thread, a seeded split and
seeded batch order. A held-out validation share (``val_frac``, split by request -- for TRAIL's
decode samples, by the request they come from) selects the epoch: training runs up to ``epochs``
epochs and stops after ``patience`` epochs without a better validation loss; the best epoch's
weights are exported. Losses are the methods' own (see each predictor's module docstring).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from predictors.heads import TrainingUnavailable, spec_in_out, standardization


def _torch():
    try:
        import torch
    except ImportError:
        raise TrainingUnavailable("training the baselines needs torch (pip install -e '.[train]')") from None
    torch.set_num_threads(1)
    return torch


# ----------------------------------------------------------------------------- modules
def build_module(spec: list[dict]):
    """A torch module implementing a head spec (same ops as :class:`predictors.heads.Head`)."""
    torch = _torch()
    nn = torch.nn
    layers: list = []
    names: list = []
    for op in spec:
        kind = op["op"]
        if kind == "linear":
            layers.append(nn.Linear(op["in"], op["out"]))
            names.append(op["name"])
        elif kind == "layernorm":
            layers.append(nn.LayerNorm(op["dim"], eps=op["eps"]))
            names.append(op["name"])
        elif kind == "relu":
            layers.append(nn.ReLU())
            names.append(None)
        elif kind == "gelu":
            layers.append(nn.GELU(approximate="tanh"))
            names.append(None)
        elif kind == "dropout":
            layers.append(nn.Dropout(op["p"]))
            names.append(None)
        else:
            raise ValueError(f"unknown op {kind!r}")
    module = nn.Sequential(*layers)
    module.op_names = names
    return module


def export_module(head: str, spec: list[dict], module, x_mean=None, x_scale=None) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, layer in zip(module.op_names, module):
        if name is None:
            continue
        if hasattr(layer, "in_features"):
            out[f"{head}.{name}.w"] = layer.weight.detach().numpy().T.copy()
            out[f"{head}.{name}.b"] = layer.bias.detach().numpy().copy()
        else:
            out[f"{head}.{name}.g"] = layer.weight.detach().numpy().copy()
            out[f"{head}.{name}.b"] = layer.bias.detach().numpy().copy()
    if x_mean is not None:
        out[f"{head}.x_mean"] = np.asarray(x_mean, dtype=np.float64)
        out[f"{head}.x_scale"] = np.asarray(x_scale, dtype=np.float64)
    return out


def round_like_storage(module) -> None:
    """Round linear weights to float16 in place (what the weight file stores), so the validation
    loss and the exported head see the same numbers."""
    torch = _torch()
    with torch.no_grad():
        for layer in module:
            if hasattr(layer, "in_features"):
                layer.weight.copy_(layer.weight.half().float())


def split(n: int, val_frac: float, seed: int, groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train/validation split of ``n`` items (by ``groups`` when given)."""
    rng = np.random.default_rng(seed)
    if groups is None:
        perm = rng.permutation(n)
        n_val = int(round(val_frac * n)) if n >= 20 else 0
        return np.sort(perm[n_val:]), np.sort(perm[:n_val])
    uniq = np.unique(groups)
    perm = rng.permutation(len(uniq))
    n_val = int(round(val_frac * len(uniq))) if len(uniq) >= 20 else 0
    val_groups = uniq[perm[:n_val]]
    is_val = np.isin(groups, val_groups)
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def fit(modules: dict, loss_fn: Callable, n: int, *, epochs: int, lr: float, weight_decay: float, batch: int,
        seed: int, val_frac: float, patience: int, groups: np.ndarray | None = None,
        batches: Callable[[np.ndarray, np.random.Generator], list[np.ndarray]] | None = None) -> dict:
    """Minimise ``loss_fn(idx)`` (a scalar tensor over the items ``idx``) with AdamW.

    ``batches(train_idx, rng)`` may override the default shuffled mini-batches (LTR's lists).
    Returns notes: epochs run, best epoch, best validation loss, seconds.
    """
    torch = _torch()
    torch.manual_seed(seed)
    started = time.perf_counter()
    train_idx, val_idx = split(n, val_frac, seed, groups)
    if len(val_idx) == 0:
        val_idx = train_idx
    params = [p for m in modules.values() for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    rng = np.random.default_rng(seed + 1)
    best, best_epoch, best_state, since = float("inf"), -1, None, 0
    history = []
    epoch = 0
    for epoch in range(epochs):
        for m in modules.values():
            m.train()
        if batches is not None:
            plan = batches(train_idx, rng)
        else:
            perm = rng.permutation(train_idx)
            plan = [perm[i:i + batch] for i in range(0, len(perm), batch)]
        for idx in plan:
            if len(idx) < 2:
                continue
            opt.zero_grad()
            loss = loss_fn(idx)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        for m in modules.values():
            m.eval()
        with torch.no_grad():
            val = float(loss_fn(val_idx, validation=True))
        history.append(round(val, 6))
        if val < best - 1e-6:
            best, best_epoch, since = val, epoch, 0
            best_state = {k: {n_: t.detach().clone() for n_, t in m.state_dict().items()} for k, m in modules.items()}
        else:
            since += 1
            if since >= patience:
                break
    if best_state is not None:
        for k, m in modules.items():
            m.load_state_dict(best_state[k])
    for m in modules.values():
        m.eval()
        round_like_storage(m)
    return {"epochs_run": epoch + 1, "best_epoch": best_epoch + 1, "best_val_loss": best,
            "train_items": int(len(train_idx)), "val_items": int(len(val_idx)),
            "val_history": history, "train_seconds": round(time.perf_counter() - started, 3)}


def tensor(x, dtype=None):
    torch = _torch()
    return torch.as_tensor(np.ascontiguousarray(x), dtype=dtype or torch.float32)


def standardized_tensor(X: np.ndarray):
    mean, scale = standardization(X)
    return tensor(((X.astype(np.float64) - mean) / scale).astype(np.float32)), mean, scale


def check_width(spec: list[dict], X: np.ndarray, what: str) -> None:
    n_in, _ = spec_in_out(spec)
    if X.shape[1] != n_in:
        raise ValueError(f"{what}: features have {X.shape[1]} dimensions, head expects {n_in}")
