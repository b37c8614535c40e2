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
  its next step start (the simulator's ``PendingUpdate`` / publish / re-score).
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from live.config import LiveSchedulerConfig


class LivePredictor:
    name = "none"
    stage: str | None = None            # "arrival" (oracle) or "prefill" (leap)

    def at_arrival(self, request) -> float:
        return 0.0

    def standardize(self, vectors: np.ndarray) -> np.ndarray | None:
        return None

    def on_finished(self, feature: np.ndarray | None, output_tokens: int) -> None:
        pass

    def has_update(self) -> bool:
        return False

    def rescore(self, Z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def stats(self) -> dict:
        return {"name": self.name}

    def close(self) -> None:
        pass


class OracleLive(LivePredictor):
    name = "oracle"
    stage = "arrival"

    def at_arrival(self, request) -> float:
        return float(request.max_tokens)


class LeapLive(LivePredictor):
    name = "leap"
    stage = "prefill"

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
        from predictors.leap import AnchoredRLS, get_target

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
            self._queue.put((np.stack(self._buf_z), np.asarray(self._buf_y)))
            self._submitted += 1
            self._buf_z, self._buf_y = [], []

    def _work(self) -> None:
        from predictors.leap import with_bias

        version = 0
        while True:
            item = self._queue.get()
            if item is None:
                return
            Z, y = item
            t = time.thread_time()
            self._rls.update(with_bias(Z), self._target.forward(y))
            theta = self._rls.theta
            self.update_cpu_s.append(time.thread_time() - t)
            self.update_rows.append(len(y))
            version += 1
            self._published = (version, theta)

    def has_update(self) -> bool:
        return self._published[0] > self._seen_version

    def rescore(self, Z):
        t = time.perf_counter()
        version, theta = self._published
        self._seen_version = version
        out = self.readout.output(Z @ theta[:-1] + theta[-1])
        self.rescore_s.append(time.perf_counter() - t)
        return out

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


def make_live_predictor(cfg: LiveSchedulerConfig) -> LivePredictor:
    if cfg.predictor == "oracle":
        return OracleLive()
    if cfg.predictor == "leap":
        return LeapLive(cfg)
    if cfg.predictor == "leap-rls":
        return LeapRLSLive(cfg)
    return LivePredictor()
