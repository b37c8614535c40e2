"""Live predictors: where each estimate comes from inside a running vLLM engine.

- ``none``: no estimate (FCFS).
- ``oracle``: the request's ``max_tokens``, exact when the length is forced
  (``SamplingParams(min_tokens=L, max_tokens=L, ignore_eos=True)``); known at arrival.
- ``leap``: the worker hook's read-out at the end of prefill (``live.worker_ext``); before it, the
  training trace's mean length (the simulator's ``prior_length``).
- ``leap-rls``: as ``leap``, and each finished request's standardised hook vector and true length
  feed anchored RLS (``predictors.leap.AnchoredRLS``, the simulator's math) on a background CPU
  thread, ``update_every`` requests per update; the thread publishes a weight snapshot when an
  update completes, and the scheduler re-scores every resident request with the newest snapshot at
  its next step start (the simulator's ``PendingUpdate`` / publish / re-score). With
  ``sync_updates`` (leap-serve's step clock) the update runs at once, inside the step whose
  finish completes the batch, so the next step always sees it.
- ``ssjf``: the text-encoder baseline. At arrival the request's raw prompt text (``SamplingParams.
  extra_args[PROMPT_TEXT_KEY]``) is queued to a background CPU thread that embeds it with the
  capture's own all-MiniLM-L6-v2 encoder (``capture.features.TextEncoder``: mean pooling, L2
  norm, 256 tokens; one prompt per call, no padding) and scores the embedding with SSJF's shipped
  head (``predictors.ssjf.SSJF.lengths_of``, the simulator's numpy code). The scheduler takes the
  scores in at its next step start; until then a request holds the simulator's uninformed prior
  (``LiveSchedulerConfig.prior_tokens``, the workload's half cap, when set -- always with forced
  lengths, where ``max_tokens`` is the true length; else half its ``max_tokens``). Nothing runs in the engine's step but the hand-off.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from live.config import PROMPT_TEXT_KEY, LiveSchedulerConfig
from predictors.live import LIVE_PREDICTORS


class LivePredictor:
    """No estimate (FCFS); the base of every live predictor. Its stage, hook and simulator twin are
    declared once, by name, in :data:`predictors.live.LIVE_PREDICTORS`."""

    name = "none"
    async_scores = False                # arrival scores come later through take_scores()

    def __init__(self, cfg: LiveSchedulerConfig | None = None):
        pass

    @property
    def stage(self) -> str | None:
        """"arrival" (oracle, ssjf: may order admission), "prefill" (leap) or None (no predictor)."""
        return LIVE_PREDICTORS[self.name].stage

    def at_arrival(self, request) -> float:
        return 0.0

    def take_scores(self) -> list[tuple[str, float]]:
        """Arrival-stage scores finished since the last call: (engine request id, estimate)."""
        return []

    def standardize(self, vectors: np.ndarray) -> np.ndarray | None:
        return None

    def on_finished(self, feature: np.ndarray | None, output_tokens: int) -> None:
        pass

    def has_update(self) -> bool:
        return False

    def rescore(self, Z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def score_new(self, Z: np.ndarray) -> np.ndarray | None:
        """Estimates of newly prefilled requests from the latest published weights, or None to keep
        the hook's own value (no online update yet)."""
        return None

    def stats(self) -> dict:
        return {"name": self.name}

    def close(self) -> None:
        pass


class OracleLive(LivePredictor):
    name = "oracle"

    def at_arrival(self, request) -> float:
        return float(request.max_tokens)


class LeapLive(LivePredictor):
    name = "leap"

    def __init__(self, cfg: LiveSchedulerConfig):
        self.file = cfg.readout_file()
        self.readout = self.file.readout

    def at_arrival(self, request) -> float:
        return float(self.readout.prior_length)

    def stats(self) -> dict:
        return {"name": self.name, "layer": self.file.info["layer"], "hidden_size": self.file.info["hidden_size"],
                "readout": self.file.path}


class LeapRLSLive(LeapLive):
    name = "leap-rls"

    def __init__(self, cfg: LiveSchedulerConfig):
        super().__init__(cfg)
        from core.readout import get_target
        from predictors.leap import AnchoredRLS

        self.update_every = cfg.update_every
        self._target = get_target(self.readout.target)
        self._rls = AnchoredRLS.from_weights(self.file.theta, self.file.gram)
        self._published = (0, self._rls.theta)     # (version, weights): swapped whole, read whole
        self._seen_version = 0
        self._buf_z: list[np.ndarray] = []
        self._buf_y: list[float] = []
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._submitted = 0
        self.update_cpu_s: list[float] = []          # thread CPU time per update
        self.update_rows: list[int] = []
        self.rescore_s: list[float] = []
        self.on_publish = None          # called after each publish (served plugin: a log line)
        self._sync = cfg.sync_updates                # step clock: update in the finishing step
        if not self._sync:
            self._thread = threading.Thread(target=self._work, name="leap-rls", daemon=True)
            self._thread.start()

    def standardize(self, vectors):
        return self.readout.standardize(vectors, dtype=np.float64)

    def on_finished(self, feature, output_tokens):
        if feature is None:             # finished before its prediction was taken in (e.g. aborted)
            return
        self._buf_z.append(feature)
        self._buf_y.append(float(output_tokens))
        if len(self._buf_z) >= self.update_every:
            batch = (np.stack(self._buf_z), np.asarray(self._buf_y))
            self._submitted += 1
            self._buf_z, self._buf_y = [], []
            if self._sync:
                self._apply(*batch)
            else:
                self._queue.put(batch)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._apply(*item)

    def _apply(self, Z, y) -> None:
        """One online update, then its weights published (swapped whole)."""
        from core.readout import with_bias

        t = time.thread_time()
        self._rls.update(with_bias(Z), self._target.forward(y))
        theta = self._rls.theta
        self.update_cpu_s.append(time.thread_time() - t)
        self.update_rows.append(len(y))
        self._published = (self._published[0] + 1, theta)
        if self.on_publish is not None:
            self.on_publish(self._published[0], len(y), self.update_cpu_s[-1])

    def has_update(self) -> bool:
        return self._published[0] > self._seen_version

    def rescore(self, Z):
        t = time.perf_counter()
        version, theta = self._published
        self._seen_version = version
        out = self.readout.output(Z @ theta[:-1] + theta[-1])
        self.rescore_s.append(time.perf_counter() - t)
        return out

    def score_new(self, Z):
        """The simulator scores a new feature with the current weights (``_predict_after_prefill``);
        the hook folds the original ridge weights, so once an update is published the newest weights
        replace its value. Reads ``_published`` only: the residents' re-score on the next publish
        (``has_update`` / ``rescore``) is unaffected."""
        version, theta = self._published
        if version == 0:
            return None
        return self.readout.output(Z @ theta[:-1] + theta[-1])

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Block until every queued update is published (tests, end of a run)."""
        deadline = time.monotonic() + timeout_s
        while self._published[0] < self._submitted:
            if time.monotonic() > deadline:
                raise TimeoutError("RLS updates did not finish")
            time.sleep(0.01)

    def stats(self) -> dict:
        out = super().stats()
        out.update({"updates_published": self._published[0], "update_every": self.update_every,
                    "update_cpu_s": list(self.update_cpu_s), "update_rows": list(self.update_rows),
                    "rescore_s": list(self.rescore_s)})
        return out

    def close(self) -> None:
        self._queue.put(None)


class SSJFLive(LivePredictor):
    """SSJF's head on the live MiniLM embedding of the prompt text, computed on a CPU thread."""

    name = "ssjf"
    async_scores = True

    def __init__(self, cfg: LiveSchedulerConfig):
        from capture.features import TextEncoder
        from predictors.ssjf import SSJF

        self.prior_tokens = cfg.prior_tokens
        self.head_path = str(cfg.head_weights_path())
        self.model = SSJF(cfg.head_artifact())
        t = time.perf_counter()
        self.encoder = TextEncoder(batch=1)
        self.encoder_load_s = time.perf_counter() - t
        self._in: queue.SimpleQueue = queue.SimpleQueue()
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._submitted = 0
        self._done = 0
        self.no_text = 0                        # requests that carried no prompt text (kept the prior)
        self.embed_cpu_s: list[float] = []      # thread CPU time per prompt: tokenise + encode + pool
        self.embed_wall_s: list[float] = []
        self.head_cpu_s: list[float] = []       # SSJF head (numpy) per prompt
        self.encoder_tokens: list[int] = []
        self.take_s: list[float] = []           # hand-off on the scheduler's thread, per step with scores
        self.embeddings: dict[str, np.ndarray] = {}
        self.keep_embeddings = False            # tests compare them with recorded ones
        self._thread = threading.Thread(target=self._work, name="leap-ssjf-encoder", daemon=True)
        self._thread.start()

    def score_texts(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(embeddings, SSJF lengths) of raw prompt texts, one encoder call per prompt."""
        emb = np.concatenate([self.encoder.encode([t]) for t in texts]) if texts else np.zeros((0, 384), np.float32)
        return emb, self.model.lengths_of(emb)

    def at_arrival(self, request) -> float:
        extra = getattr(request.sampling_params, "extra_args", None) or {}
        text = extra.get(PROMPT_TEXT_KEY)
        if isinstance(text, str):
            self._in.put((request.request_id, text))
            self._submitted += 1
        else:
            self.no_text += 1
        return self.prior(request)              # the simulator's prior until the score lands

    def prior(self, request) -> float:
        """The configured prior (the workload's half cap), else half the request's own cap."""
        return float(self.prior_tokens) if self.prior_tokens is not None else float(request.max_tokens) / 2.0

    def _work(self) -> None:
        while True:
            item = self._in.get()
            if item is None:
                return
            rid, text = item
            c0, w0 = time.thread_time(), time.perf_counter()
            emb = self.encoder.encode([text])
            c1, w1 = time.thread_time(), time.perf_counter()
            value = float(self.model.lengths_of(emb)[0])
            c2 = time.thread_time()
            self.embed_cpu_s.append(c1 - c0)
            self.embed_wall_s.append(w1 - w0)
            self.head_cpu_s.append(c2 - c1)
            self.encoder_tokens.append(len(self.encoder.tok(text, truncation=True, max_length=256)["input_ids"]))
            if self.keep_embeddings:
                self.embeddings[rid] = emb[0]
            self._out.put((rid, value))
            self._done += 1

    def take_scores(self):
        t = time.perf_counter()
        out = []
        while True:
            try:
                out.append(self._out.get_nowait())
            except queue.Empty:
                break
        if out:
            self.take_s.append(time.perf_counter() - t)
        return out

    def wait_idle(self, timeout_s: float = 120.0) -> None:
        """Block until every queued prompt is scored (tests, benchmarks: score before stepping)."""
        deadline = time.monotonic() + timeout_s
        while self._done < self._submitted:
            if time.monotonic() > deadline:
                raise TimeoutError("text-encoder scoring did not finish")
            time.sleep(0.005)

    def stats(self) -> dict:
        return {"name": self.name, "head_weights": self.head_path, "encoder": "all-MiniLM-L6-v2",
                "encoder_load_s": self.encoder_load_s, "scored": self._done, "no_text": self.no_text,
                "embed_cpu_s": list(self.embed_cpu_s), "embed_wall_s": list(self.embed_wall_s),
                "head_cpu_s": list(self.head_cpu_s), "encoder_tokens": list(self.encoder_tokens),
                "take_s": list(self.take_s), "prior_tokens": self.prior_tokens}

    def close(self) -> None:
        self._in.put(None)


#: live predictor name -> its class: one for every name in predictors.live.LIVE_PREDICTORS
LIVE_CLASSES: dict[str, type[LivePredictor]] = {
    cls.name: cls for cls in (LivePredictor, OracleLive, LeapLive, LeapRLSLive, SSJFLive)}


def make_live_predictor(cfg: LiveSchedulerConfig) -> LivePredictor:
    return LIVE_CLASSES[cfg.predictor](cfg)
