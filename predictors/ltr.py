"""LTR (Fu et al., NeurIPS 2024): learn the ORDER of output lengths with a listwise ranking loss.

Model (paper: OPT-125m, ``AutoModelForSequenceClassification`` with one label = a linear score on
the last token's final state, fine-tuned with ListMLE over shuffled lists of 32 prompts). Here:
- Input: ``text_embedding`` (all-MiniLM-L6-v2, 384-d, standardised) -- DEVIATION: a frozen 22M
  stand-in encoder instead of fine-tuning OPT-125m; since the encoder cannot adapt, the score head
  gets one hidden layer: Linear(e,128) -> ReLU -> Linear(128,1).
- Labels (LTR's): label = (8192 // g) - min(8192, L) // g with g = 10 (10-token buckets; higher =
  shorter). Ties are broken randomly (a fresh seeded permutation of every list before sorting).
- Loss: ListMLE (allRank): each shuffled batch of 32 training prompts is one list; with the list
  sorted by label descending, loss = sum_i [logsumexp(s_i..s_n) - s_i] (mean over lists).
- Training: AdamW lr 1e-3, weight decay 0.01 (paper: Adam 2e-5 / wd 0.01 on the full model), up to
  200 epochs, early stopping on the ListMLE of fixed validation lists (10% split, patience 20), seed 0.

Output (``output = "rank"``): a score, not a length. The learned s is "higher = shorter"; the
predictor returns exp(s_top - s), clipped to [1, 1e12], with s_top the highest score over the
training trace: positive and >= 1 (``aging`` multiplies it and floors admission keys at 1), lower =
serve first; exp(s) is the Plackett-Luce strength that ListMLE fits, so the value is the inverse
strength relative to the training trace's "shortest" prompt. Scores are computed once per request
and never refreshed (as in LTR).

Scheduler: ``countdown`` uses the static score as the key (common comparison); LTR's starvation
promotion (200 idle steps -> top priority for 10 runs) is the policy ``ltr-starvation``.

Cost (:mod:`predictors.gpu_cost`): OPT-125m, 125M parameters of which 40.2M are the token and
position embeddings; 84.8M streamed per call. Per call 1.281 ms (12 layers x 0.1 ms + 1 head kernel
+ 170 MB at 2.345 TB/s); per prompt token 0.268 us (2 x 84.8M FLOP at 633 TFLOP/s). A 200-token
prompt scored alone: 1.33 ms.
"""

from __future__ import annotations

import numpy as np

from core.hardware import DEFAULT_HARDWARE, Hardware
from core.trace import Trace
from predictors.base import PredictorCost
from predictors.gpu_cost import OPT_125M, encoder_cost
from predictors.heads import Artifact, HeadPredictor, act, linear, new_artifact

METHOD = "ltr"
VERSION = 1
LABEL_MAX = 8192
SCORE_CLIP = 1e12

DEFAULTS = dict(column="text_embedding", hidden=128, list_size=32, bucket=10, epochs=200, patience=20,
                lr=1e-3, weight_decay=0.01, seed=0, val_frac=0.1)


def ltr_label(lengths, bucket: int = 10) -> np.ndarray:
    """LTR's relevance label: higher = shorter (8192 // g - min(8192, L) // g)."""
    L = np.asarray(lengths, dtype=np.int64)
    return (LABEL_MAX // bucket - np.minimum(LABEL_MAX, L) // bucket).astype(np.float64)


def listmle_numpy(scores: np.ndarray, labels: np.ndarray) -> float:
    """ListMLE of one list (reference implementation; ties kept in the given order)."""
    order = np.argsort(-labels, kind="stable")
    s = scores[order]
    tail = np.logaddexp.accumulate(s[::-1])[::-1]
    return float(np.sum(tail - s))


def head_spec(d: int, hidden: int) -> list[dict]:
    if hidden <= 0:
        return [linear("l0", d, 1)]
    return [linear("l0", d, hidden), act("relu"), linear("l1", hidden, 1)]


def train(trace: Trace, settings: dict) -> Artifact:
    from predictors import training as T
    torch = T._torch()
    X = trace.feature(settings["column"])
    labels = ltr_label(trace.output_tokens, settings["bucket"])
    spec = head_spec(X.shape[1], settings["hidden"])
    Xt, x_mean, x_scale = T.standardized_tensor(X)
    size = int(settings["list_size"])
    torch.manual_seed(settings["seed"])
    mods = {"score": T.build_module(spec)}
    tie_rng = np.random.default_rng(settings["seed"] + 7)

    def lists(idx: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        perm = rng.permutation(idx)
        return [perm[i:i + size] for i in range(0, len(perm), size)]

    val_lists: dict = {}

    def list_loss(idx_list: list[np.ndarray], rng: np.random.Generator):
        total = 0.0
        for idx in idx_list:
            if len(idx) < 2:
                continue
            idx = rng.permutation(idx)                  # random tie-breaking
            order = np.argsort(-labels[idx], kind="stable")
            s = mods["score"](Xt[torch.as_tensor(idx[order])]).squeeze(1)
            tail = torch.logcumsumexp(s.flip(0), 0).flip(0)
            total = total + (tail - s).sum()
        return total / max(len(idx_list), 1)

    def loss_fn(idx, validation=False):
        idx = np.asarray(idx)
        if validation:
            key = idx.tobytes()
            if key not in val_lists:
                val_lists[key] = lists(idx, np.random.default_rng(12345))
            return list_loss(val_lists[key], np.random.default_rng(54321))
        return list_loss([idx], tie_rng)

    notes = T.fit(mods, loss_fn, len(labels), epochs=settings["epochs"], lr=settings["lr"],
                  weight_decay=settings["weight_decay"], batch=size, seed=settings["seed"],
                  val_frac=settings["val_frac"], patience=settings["patience"], batches=lists)
    arrays = T.export_module("score", spec, mods["score"], x_mean, x_scale)
    art = new_artifact(METHOD, VERSION, trace, settings, {"score": spec}, arrays,
                       train_seconds=notes["train_seconds"], training=notes)
    s = art.head("score")(X)[:, 0]
    art.arrays["out.score_top"] = np.array(np.max(s), dtype=np.float32)
    art._heads.clear()
    return art


class LTR(HeadPredictor):
    __doc__ = __doc__
    name = method = METHOD
    version = VERSION
    defaults = DEFAULTS
    trainer = staticmethod(train)
    output = "rank"
    stage = "arrival"
    compiled, scores_at_arrival, serves_router = True, False, False
    why_not = {"scores_at_arrival": "its score is a rank, not a length a router could add up",
               "serves_router": "its score is a rank, not a token count a router could add up"}
    requires = ("text_embedding",)

    def __init__(self, artifact: Artifact):
        super().__init__(artifact)
        self._head = artifact.head("score")
        self._top = float(artifact.arrays["out.score_top"])


    def raw_score(self, X) -> np.ndarray:
        """The learned score s (higher = shorter)."""
        return self._head(X)[:, 0]

    def rank_score(self, X) -> np.ndarray:
        """exp(s_top - s): >= 1, lower = serve first."""
        return np.clip(np.exp(np.minimum(self._top - self.raw_score(X), 60.0)), 1.0, SCORE_CLIP)

    def bind(self, workload, rng):
        super().bind(workload, rng)
        self._score = self.rank_score(workload.feature(self.column))

    def predict(self, rows, known=None):
        return self._score[np.asarray(rows, dtype=np.int64)]

    @property
    def prior_length(self) -> float:
        return SCORE_CLIP   # only used before a request is scored: last

    def cost(self, hardware: Hardware = DEFAULT_HARDWARE) -> PredictorCost:
        return encoder_cost(OPT_125M, hardware.gpu)

    def describe(self) -> dict:
        return {"name": self.name, **self.artifact.describe(), "encoder_charged": OPT_125M.name}
