"""EGTP (Xie et al., ICLR 2026): entropy-guided pooling of the serving model's prompt states.

Feature (capture time, ``feat_entropy_pooled``): for every prompt token i, the next-token entropy
H_i of the serving model's full-vocabulary distribution; h = sum_i softmax(H)_i h_i over the
token states of the pooling layer (block 29 of SmolLM2's 30, i.e. the last block, as the
reimplementation of EGTP says "last layer"). No learned pooling parameters.

Head (the author code, as quoted): Linear(d, d/2) -> LayerNorm -> ReLU -> Dropout(0.1) ->
Linear(d/2, 20), on the standardised pooled state (576-288-20 here).
- Bins: K = 20 equal-width bins over the training trace's [1%, 99%] quantile range of output
  length (the reimplementation's choice; the paper's edges are unknown); centres c_j; lengths
  outside the range fall in the end bins.
- Soft labels: p_j ∝ exp(-|j - i|), i = the true bin.
- Prediction: yhat = sum_j softmax_j c_j (expected length).
- Loss: 0.95 CE(p, softmax) + 0.05 MSE(y, yhat), with the MSE on lengths divided by the bin range
  (q99 - q1) so both terms are O(1) (the paper's scaling is unknown; in raw tokens^2 the MSE would
  swamp the CE).
- Training: AdamW lr 1e-3, weight decay 0.01, batch 16, up to 200 epochs, early stopping on a 10%
  validation split (patience 20), seed 0, one thread (paper: AdamW 2e-5, <= 10 epochs, batch 16,
  seed 42; the larger rate suits a head trained alone on 1k prompts).

Stage ``prefill``: the estimate exists when the prefill ends (``tap_fraction`` 1: the entropies need
the final logits), so EGTP orders decode slots only; admission is FCFS.

Cost (:func:`predictors.gpu_cost.egtp_cost`), charged to the prefill step: the full-vocabulary
logits at EVERY prompt position of the serving model (Qwen3-8B: vocab 151,936 x hidden 4,096),
which prefill normally computes for the last position only: per prompt token 1.966 us of LM-head
matmul (2 x 151,936 x 4,096 = 1.245 GFLOP at 633 TFLOP/s) + 0.777 us of logits traffic (fp32 logits
written once, read twice: 1.82 MB at 2.345 TB/s) = 2.744 us/token; the LM-head weights are not
re-read (prefill streams them anyway). Per call 0.099 ms: 6 entropy/softmax/pooling kernels + the
4096-2048-20 head (8.44M parameters, 5 kernels, 16.9 MB read). A 200-token prompt alone: 0.65 ms.
"""

from __future__ import annotations

import numpy as np

from core.hardware import DEFAULT_HARDWARE, Hardware
from core.trace import Trace
from predictors.base import PredictorCost
from predictors.gpu_cost import egtp_cost
from predictors.heads import Artifact, HeadPredictor, act, dropout, layernorm, linear, new_artifact, softmax

METHOD = "egtp"
VERSION = 1

DEFAULTS = dict(column="feat_entropy_pooled", bins=20, q_low=1.0, q_high=99.0, ce_weight=0.95,
                epochs=200, patience=20, lr=1e-3, weight_decay=0.01, batch=16, seed=0, val_frac=0.1)


def egtp_bins(lengths, k: int, q_low: float = 1.0, q_high: float = 99.0) -> np.ndarray:
    lo, hi = np.percentile(np.asarray(lengths, dtype=np.float64), [q_low, q_high])
    if hi <= lo:
        hi = lo + 1.0
    return np.linspace(lo, hi, k + 1)


def bin_of(lengths, edges: np.ndarray) -> np.ndarray:
    k = len(edges) - 1
    w = edges[1] - edges[0]
    return np.clip(np.floor((np.asarray(lengths, dtype=np.float64) - edges[0]) / w), 0, k - 1).astype(np.int64)


def soft_labels(bins: np.ndarray, k: int) -> np.ndarray:
    """p_j ∝ exp(-|j - i|) for each true bin i (rows sum to 1)."""
    j = np.arange(k)
    p = np.exp(-np.abs(j[None, :] - np.asarray(bins)[:, None]).astype(np.float64))
    return p / p.sum(axis=1, keepdims=True)


def head_spec(d: int, k: int) -> list[dict]:
    h = max(d // 2, 1)
    return [linear("l0", d, h), layernorm("n0", h), act("relu"), dropout(0.1), linear("l1", h, k)]


def train(trace: Trace, settings: dict) -> Artifact:
    from predictors import training as T
    torch = T._torch()
    X = trace.feature(settings["column"])
    L = trace.output_tokens.astype(np.float64)
    k = int(settings["bins"])
    edges = egtp_bins(L, k, settings["q_low"], settings["q_high"])
    centres = 0.5 * (edges[:-1] + edges[1:])
    span = float(edges[-1] - edges[0])
    spec = head_spec(X.shape[1], k)
    Xt, x_mean, x_scale = T.standardized_tensor(X)
    soft = T.tensor(soft_labels(bin_of(L, edges), k))
    yt = T.tensor(L / span)
    ct = T.tensor(centres / span)
    w = float(settings["ce_weight"])
    torch.manual_seed(settings["seed"])
    mods = {"egtp": T.build_module(spec)}

    def loss_fn(idx, validation=False):
        idx = torch.as_tensor(idx)
        logits = mods["egtp"](Xt[idx])
        logp = torch.log_softmax(logits, dim=1)
        ce = -(soft[idx] * logp).sum(dim=1).mean()
        yhat = (logp.exp() * ct).sum(dim=1)
        mse = ((yhat - yt[idx]) ** 2).mean()
        return w * ce + (1.0 - w) * mse

    notes = T.fit(mods, loss_fn, len(L), epochs=settings["epochs"], lr=settings["lr"],
                  weight_decay=settings["weight_decay"], batch=settings["batch"], seed=settings["seed"],
                  val_frac=settings["val_frac"], patience=settings["patience"])
    arrays = {**T.export_module("egtp", spec, mods["egtp"], x_mean, x_scale), "out.edges": edges}
    return new_artifact(METHOD, VERSION, trace, settings, {"egtp": spec}, arrays,
                        train_seconds=notes["train_seconds"], training=notes)


class EGTP(HeadPredictor):
    __doc__ = __doc__
    name = method = METHOD
    version = VERSION
    defaults = DEFAULTS
    trainer = staticmethod(train)
    output = "length"
    stage = "prefill"
    compiled, scores_at_arrival, serves_router = True, False, True
    why_not = {"scores_at_arrival": "it reads the serving model's prefill state (entropy-pooled)"}
    requires = ("feat_entropy_pooled",)

    def __init__(self, artifact: Artifact):
        super().__init__(artifact)
        self._head = artifact.head("egtp")
        self.edges = np.asarray(artifact.arrays["out.edges"], dtype=np.float64)
        self.centres = 0.5 * (self.edges[:-1] + self.edges[1:])


    def bin_probabilities(self, X) -> np.ndarray:
        return softmax(self._head(X))

    def expected_length(self, X) -> np.ndarray:
        return np.maximum(self.bin_probabilities(X) @ self.centres, 1.0)

    def bind(self, workload, rng):
        super().bind(workload, rng)
        self._estimate = self.expected_length(workload.feature(self.column))

    def predict(self, rows, known=None):
        return self._estimate[np.asarray(rows, dtype=np.int64)]

    def fixed_estimates(self) -> np.ndarray | None:
        return self._estimate

    def cost(self, hardware: Hardware = DEFAULT_HARDWARE) -> PredictorCost:
        return egtp_cost(hardware.model, hardware.gpu)

    def describe(self) -> dict:
        return {"name": self.name, **self.artifact.describe(), "bin_edges": self.edges.tolist()}
