"""TRAIL (Shahout et al., ICLR 2025): an embedding probe refreshed during decode, Bayesian-smoothed.

Two predictors, as in the paper:
- Prompt prior, for WAITING requests (stage ``arrival``, so it may order admission). Paper:
  distilbert-base-uncased fine-tuned as a 10-bin classifier. Here -- DEVIATION: the frozen
  all-MiniLM-L6-v2 ``text_embedding`` (22M stand-in, no model hub) with DistilBERT's classifier head
  shape, Linear(e,e) -> ReLU -> Linear(e,10) (384-384-10), cross-entropy on the bin of the total
  length.
- Embedding probe on the serving model's early-middle layer. Paper: layer 11 of 32 (Llama-3-8B),
  MLP 4096-512-10, cross-entropy on the bin of the REMAINING length. Here: block 10 of SmolLM2's 30
  (the trace's ``feat_mean`` layer, same relative depth), MLP d-512-10 (576-512-10), standardised
  input. Training samples: every recorded decode vector (``NAME.decode.parquet`` rows of that
  layer: the last token's state after g generated tokens, target L - g) plus one prefill sample per
  request (``feat_mean``, the mean over prompt tokens -- what TRAIL's code feeds the probe at
  prefill -- target L - 1). Split into train/validation by request.
- Training (both): AdamW lr 1e-3, weight decay 0.01, batch 32, up to 200 epochs, early stopping on
  a 10% by-request validation split (patience 20), seed 0, one thread. (Paper: lr 0.01 cosine, batch
  32 for the probe; 1.6e-5 for DistilBERT.)

Bins -- scaled to the trace: the paper's 10 equal-width bins over [0, 512] become 10 equal-width
bins over [0, M] with M = the training trace's output cap (1,024 for the bundled traces), so
bin_size = M / 10 = 102.4 tokens, midpoints 51.2, 153.6, ...; a remaining length >= M - bin_size
falls in the last bin.

Bayesian smoothing (TRAIL's ``trail_predictor.py``), :func:`smooth`: p = min(1, 1 / bin_size);
T[0,0] = 1, T[i,i] = 1 - p, T[i,i-1] = p; at an observation k tokens after the previous one,
prior = post_prev @ T^k and post ∝ prior ⊙ softmax(MLP(e)). The chain starts from the prompt
prior's bin distribution at arrival (generated 0); the prefill observation is at generated 1.
Estimate: remaining = sum_i post_i * mid_i, clamped to [1, M_w - g] (M_w = the run's cap); the
predictor reports total = g + remaining, so ``countdown`` counts down exactly by one per token
between refreshes.

Refresh: ``refresh_every`` = the workload's recorded k (``decode_every_k``, 64 for the bundled
traces; the paper refreshes every step, its code every 8). At a refresh after g generated tokens the
request's latest recorded vector at or below g is used (recorded at multiples of k, so exactly g
when aligned); if there is no vector newer than the last one used, the estimate is unchanged (no
evidence is counted twice). The prefill observation (the serving model's prefill state) arrives through
:meth:`Trail.after_prefill`, which the engine calls after the prefill step; the probe's GPU time
for it is charged like a refresh.
Without a decode side table (or with ``PredictorOptions.refresh = False``) TRAIL keeps the prompt
prior and counts down. The per-request rules (smoothing, estimate, observations) are
:mod:`predictors.trail_rule`, which the compiled kernel calls too; the probe's bin probabilities of
every prefill state and recorded decode vector are computed once at bind, in batches.

Scheduler: TRAIL is SPRPT on this estimate (``countdown``); its limited preemption (c = 0.8) is the
policy ``trail-preemption``.

Cost (:mod:`predictors.gpu_cost`): DistilBERT prior, 66M parameters of which 23.7M are embeddings,
42.2M + 0.6M head streamed per call: per call 0.670 ms (6 layers x 0.1 ms + 4 head kernels + 86 MB
at 2.345 TB/s), per prompt token 0.133 us (2 x 42.2M FLOP at 633 TFLOP/s); 200-token prompt alone:
0.70 ms. Probe at the paper's size (4096-512-10, 2,102,794 parameters) per refreshed request:
51.8 us (6 kernel dispatches x 8.3 us incl. the Bayesian update + 4.2 MB of weights read + 4.2 MFLOP),
charged as if each refresh were its own call (upper bound).
"""

from __future__ import annotations

import numpy as np

from core.hardware import DEFAULT_HARDWARE, Hardware
from core.trace import Trace, TraceError
from predictors import trail_rule as rule
from predictors.base import PredictorCost, PredictorOptions
from predictors.gpu_cost import DISTILBERT_BASE, encoder_cost, trail_refresh_s
from predictors.heads import Artifact, HeadPredictor, act, linear, new_artifact, softmax

METHOD = "trail"
VERSION = 1
DEFAULT_DECODE_LAYER = 10

DEFAULTS = dict(prior_column="text_embedding", probe_column="feat_mean", bins=10, bin_max=0,
                prior_hidden=0, probe_hidden=512, decode_layer=-1, epochs=200, patience=20, lr=1e-3,
                weight_decay=0.01, batch=32, seed=0, val_frac=0.1)


# ----------------------------------------------------------------------------- bins and smoothing
def bin_edges(bin_max: float, k: int) -> np.ndarray:
    return np.linspace(0.0, float(bin_max), k + 1)


def bin_index(remaining, bin_max: float, k: int) -> np.ndarray:
    size = float(bin_max) / k
    return np.clip(np.floor(np.asarray(remaining, dtype=np.float64) / size), 0, k - 1).astype(np.int64)


def transition_matrix(k: int, bin_size: float) -> np.ndarray:
    """TRAIL's T: T[0,0] = 1; T[i,i] = 1 - p, T[i,i-1] = p for i > 0, p = min(1, 1/bin_size)."""
    p = min(1.0, 1.0 / float(bin_size))
    T = np.zeros((k, k))
    T[0, 0] = 1.0
    for i in range(1, k):
        T[i, i] = 1.0 - p
        T[i, i - 1] = p
    return T


def smooth(post_prev: np.ndarray, likelihood: np.ndarray, steps, T: np.ndarray, power=None) -> np.ndarray:
    """One Bayesian update: (post_prev @ T^steps) ⊙ likelihood, renormalised (rows = requests).
    ``power(s)``: T^s (default ``np.linalg.matrix_power``; a cache of it gives the same bits)."""
    post_prev = np.atleast_2d(post_prev)
    likelihood = np.atleast_2d(likelihood)
    steps = np.broadcast_to(np.asarray(steps, dtype=np.int64), (post_prev.shape[0],))
    prior = np.empty_like(post_prev)
    for s in np.unique(steps):
        sel = steps == s
        prior[sel] = post_prev[sel] @ (np.linalg.matrix_power(T, int(s)) if power is None else power(int(s)))
    post = prior * likelihood
    total = post.sum(axis=1, keepdims=True)
    bad = ~(total[:, 0] > 0)
    post[~bad] /= total[~bad]
    post[bad] = prior[bad]          # a likelihood with no overlap: keep the prior (never happens for softmax)
    return post


# ----------------------------------------------------------------------------- decode side table
def decode_layer_of(trace: Trace, settings: dict) -> int:
    if settings.get("decode_layer", -1) >= 0:
        return int(settings["decode_layer"])
    layer = trace.feature_layer(settings["probe_column"])
    return int(layer) if layer is not None else DEFAULT_DECODE_LAYER


# ----------------------------------------------------------------------------- training
def prior_spec(e: int, hidden: int, k: int) -> list[dict]:
    return [linear("l0", e, hidden), act("relu"), linear("l1", hidden, k)]


def probe_spec(d: int, hidden: int, k: int) -> list[dict]:
    return [linear("l0", d, hidden), act("relu"), linear("l1", hidden, k)]


def probe_samples(trace: Trace, settings: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, remaining length, request row) for the probe: prefill + recorded decode vectors."""
    L = trace.output_tokens.astype(np.int64)
    n = len(L)
    X0 = trace.feature(settings["probe_column"])
    feats, rem, grp = [X0], [np.maximum(L - 1, 0)], [np.arange(n)]
    if trace.decode_path is not None:
        rows, gen, vecs = trace.decode_vectors(decode_layer_of(trace, settings))
        ok = gen < L[rows]
        feats.append(vecs[ok])
        rem.append(L[rows[ok]] - gen[ok])
        grp.append(rows[ok])
    return np.concatenate(feats), np.concatenate(rem), np.concatenate(grp)


def train(trace: Trace, settings: dict) -> Artifact:
    from predictors import training as T
    torch = T._torch()
    k = int(settings["bins"])
    bin_max = float(settings["bin_max"] or trace.output_cap)
    L = trace.output_tokens.astype(np.float64)
    # prompt prior: bin of the total length
    E = trace.feature(settings["prior_column"])
    hp = int(settings["prior_hidden"]) or E.shape[1]
    pspec = prior_spec(E.shape[1], hp, k)
    Et, e_mean, e_scale = T.standardized_tensor(E)
    yb = torch.as_tensor(bin_index(L, bin_max, k))
    torch.manual_seed(settings["seed"])
    prior = {"prior": T.build_module(pspec)}

    def prior_loss(idx, validation=False):
        idx = torch.as_tensor(idx)
        return torch.nn.functional.cross_entropy(prior["prior"](Et[idx]), yb[idx])

    common = dict(epochs=settings["epochs"], lr=settings["lr"], weight_decay=settings["weight_decay"],
                  batch=settings["batch"], seed=settings["seed"], val_frac=settings["val_frac"],
                  patience=settings["patience"])
    notes_prior = T.fit(prior, prior_loss, len(L), **common)
    # probe: bin of the remaining length, prefill + decode samples, split by request
    X, rem, grp = probe_samples(trace, settings)
    sspec = probe_spec(X.shape[1], int(settings["probe_hidden"]), k)
    Xt, x_mean, x_scale = T.standardized_tensor(X)
    rb = torch.as_tensor(bin_index(rem, bin_max, k))
    probe = {"probe": T.build_module(sspec)}

    def probe_loss(idx, validation=False):
        idx = torch.as_tensor(idx)
        return torch.nn.functional.cross_entropy(probe["probe"](Xt[idx]), rb[idx])

    notes_probe = T.fit(probe, probe_loss, len(rem), groups=grp, **common)
    arrays = {**T.export_module("prior", pspec, prior["prior"], e_mean, e_scale),
              **T.export_module("probe", sspec, probe["probe"], x_mean, x_scale),
              "out.bin_max": np.array(bin_max)}
    return new_artifact(METHOD, VERSION, trace, settings, {"prior": pspec, "probe": sspec}, arrays,
                        train_seconds=round(notes_prior["train_seconds"] + notes_probe["train_seconds"], 3),
                        training={"prior": notes_prior, "probe": notes_probe},
                        decode_layer=decode_layer_of(trace, settings), probe_samples=int(len(rem)))


# ----------------------------------------------------------------------------- predictor
class Trail(HeadPredictor):
    __doc__ = __doc__
    name = method = METHOD
    version = VERSION
    defaults = DEFAULTS
    trainer = staticmethod(train)
    output = "length"
    stage = "arrival"
    observes_prefill = True   # after_prefill: the probe on the prefill state
    compiled = scores_at_arrival = serves_router = True   # at arrival: its prompt prior
    requires = ("text_embedding", "feat_mean")

    def __init__(self, artifact: Artifact, refresh: bool | None = None):
        self.artifact = artifact
        s = artifact.settings
        self.prior_column, self.probe_column = s.get("prior_column", "text_embedding"), s.get("probe_column", "feat_mean")
        self.requires = (self.prior_column, self.probe_column)
        self.k = int(s.get("bins", 10))
        self.bin_max = float(artifact.arrays["out.bin_max"])
        self.bin_size = self.bin_max / self.k
        self.mid = (np.arange(self.k) + 0.5) * self.bin_size
        self.T = transition_matrix(self.k, self.bin_size)
        self.decode_layer = int(artifact.meta.get("decode_layer", DEFAULT_DECODE_LAYER))
        self._prior, self._probe = artifact.head("prior"), artifact.head("probe")
        self.use_refresh = refresh
        self.refresh_every = None

    @classmethod
    def from_options(cls, options: PredictorOptions) -> Trail:
        return cls(cls.artifact_for(options), refresh=options.refresh)

    # -- probabilities
    def prior_probabilities(self, E) -> np.ndarray:
        return softmax(self._prior(E))

    def probe_probabilities(self, X) -> np.ndarray:
        return softmax(self._probe(X))

    def expected_remaining(self, post: np.ndarray) -> np.ndarray:
        return np.atleast_2d(post) @ self.mid

    # -- binding
    def bind(self, workload, rng):
        super().bind(workload, rng)
        n = len(workload)
        self.cap = float(workload.output_cap)
        k = self.k
        # the probe's bin probabilities of every prefill state and recorded decode vector, computed once
        # here in batches (a refresh then only smooths): trail_rule's rules read them
        prefill_lik = self._likelihoods(self._probe.standardize(workload.feature(self.probe_column)))
        dec_key, dec_gen = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        dec_lik, vec_start = np.zeros((0, k)), np.zeros(n, dtype=np.int64)
        every = workload.metadata.get("decode_every_k")
        if self.use_refresh is not False and workload.decode_path is not None and every:
            rows, dec_gen, vecs = workload.decode_vectors(self.decode_layer)
            vec_start = np.searchsorted(rows, np.arange(n), side="left")
            # (row, generated) as one sorted key: a refresh finds a row's latest vector by bisection
            dec_key = (rows.astype(np.int64) << 32) | dec_gen
            dec_lik = self._likelihoods(self._probe.standardize(vecs))   # elementwise: the same bits as per call
            self.refresh_every = int(every)
        elif self.use_refresh is True:
            raise TraceError(f"predictor 'trail': refresh asked but trace {workload.name!r} has no decode "
                             f"side table with decode_every_k in its metadata")
        else:
            self.refresh_every = None
        self.arrays = rule.TrailArrays(
            post=np.ascontiguousarray(self.prior_probabilities(workload.feature(self.prior_column)), dtype=np.float64),
            g_post=np.zeros(n, dtype=np.int64),          # generated count the posterior refers to
            prefilled=np.zeros(n, dtype=np.bool_),
            used_g=np.zeros(n, dtype=np.int64),          # last decode vector consumed (0 = none)
            total=np.zeros(n, dtype=np.float64), prefill_lik=prefill_lik,
            dec_key=np.ascontiguousarray(dec_key, dtype=np.int64), dec_gen=np.ascontiguousarray(dec_gen, dtype=np.int64),
            dec_lik=dec_lik, vec_start=np.ascontiguousarray(vec_start, dtype=np.int64),
            powers=rule.power_table(self.T, workload.output_cap),   # generated <= max_tokens <= cap (contract)
            mid=np.ascontiguousarray(self.mid, dtype=np.float64), cap=self.cap,
            scratch=np.zeros(2 * k))
        self.post, self.g_post, self.total = self.arrays.post, self.arrays.g_post, self.arrays.total
        rule.load()
        rule.estimate_rows(np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64), self.arrays)

    def _estimate(self, rows: np.ndarray, generated: np.ndarray) -> np.ndarray:
        """The estimates of ``rows`` after ``generated`` tokens from their current posteriors (unstored)."""
        return np.array([rule.estimate_row(int(r), int(g), self.arrays) for r, g in zip(rows, generated)])

    def _likelihoods(self, standardized: np.ndarray, batch: int = 4096) -> np.ndarray:
        """softmax(probe) of standardised rows, in fixed batches (float64, C order, (rows, k))."""
        out = np.empty((len(standardized), self.k))
        for lo in range(0, len(standardized), batch):
            out[lo:lo + batch] = softmax(self._probe.forward(standardized[lo:lo + batch]))
        return out

    # -- the interface
    def predict(self, rows, known=None):
        rows = np.asarray(rows, dtype=np.int64)
        return self.total[rows]

    def after_prefill(self, rows) -> np.ndarray:
        """The prefill observation (serving-model state, mean over prompt tokens); total lengths."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        rule.after_prefill_rows(rows, self.arrays)
        return self.total[rows]

    def refresh(self, rows, generated):
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        rule.refresh_rows(rows, np.ascontiguousarray(generated, dtype=np.int64), self.arrays)
        return self.total[rows]

    def cost(self, hardware: Hardware = DEFAULT_HARDWARE) -> PredictorCost:
        enc = encoder_cost(DISTILBERT_BASE, hardware.gpu)
        return PredictorCost(gpu_s_per_call=enc.gpu_s_per_call, gpu_s_per_request=enc.gpu_s_per_request,
                             gpu_s_per_prompt_token=enc.gpu_s_per_prompt_token,
                             gpu_s_per_refresh=trail_refresh_s(hardware.gpu))

    def describe(self) -> dict:
        return {"name": self.name, **self.artifact.describe(), "bins": self.k, "bin_max": self.bin_max,
                "decode_layer": self.decode_layer, "refresh_every": self.refresh_every,
                "encoder_charged": DISTILBERT_BASE.name}
