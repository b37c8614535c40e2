"""LEAP's estimate served to routers: on the server's ``/metrics`` and in each response.

After each prefill the served scheduler (``leap_sched.vllm.Scheduler``) publishes, through
prometheus_client, two series labelled ``model_name`` and ``engine`` (the data-parallel rank):

- ``leap:estimated_output_tokens`` (histogram): one observation per request whose prefill ended
  with an estimate: the first estimate (the read-out of the hidden state for ``leap``/``leap-rls``,
  the arrival score for an arrival-stage predictor). Its ``_count`` is the number of requests
  prefilled with an estimate; buckets include 100 and 4,096 (the SHORT / LONG bins of llm-d's
  rule classifier).
- ``leap:predicted_outstanding_decode_tokens`` (gauge): over the engine's unfinished requests past
  prefill, the sum of predicted tokens left, ``max(estimate - generated, 0)`` (the newest
  estimate: leap-rls re-scores residents after an update). What llm-d's token-load scorer and
  latency predictor read instead of 1.5 x input length; 0 when the engine holds no request.

Where the series reach ``/metrics``: vLLM's API server serves prometheus_client's default registry
in its own process, and V1 runs the scheduler in the engine-core process. The series cross over
prometheus_client's multiprocess mode, which vLLM's API server reads when ``PROMETHEUS_MULTIPROC_DIR``
is set (``vllm.v1.metrics.prometheus.get_prometheus_registry``): start the server with it set to an
empty directory. Without it the series exist only in the engine core and are not served (one
log line at start says so); with the engine core in the API process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the default registry serves them directly.

Per request: the scheduler's ``_free_request`` returns the ``kv_transfer_params`` vLLM puts in
the finished request's output, which the OpenAI server returns in a non-streaming response's
``kv_transfer_params`` field: the first estimate goes there as ``leap_estimated_output_tokens``
(merged into a KV connector's own parameters when one is configured). In P/D serving the prefill
request (``max_tokens`` 1, ``do_remote_decode``) returns it to the router that picks the decode
instance. A streamed response carries no ``kv_transfer_params``; vLLM gives a plugin no other
per-request field or header.
"""

from __future__ import annotations

import math
import os

#: The histogram and gauge names, and the per-request key in ``kv_transfer_params``.
ESTIMATE_HISTOGRAM = "leap:estimated_output_tokens"
OUTSTANDING_GAUGE = "leap:predicted_outstanding_decode_tokens"
REQUEST_KEY = "leap_estimated_output_tokens"
#: Histogram upper bounds (tokens): 100 and 4,096 are llm-d's SHORT and LONG bounds.
BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 4096, 8192, 16384, 32768, float("inf"))
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def tokens_left(estimate: float, generated: int) -> float:
    """Predicted decode tokens still to come: the estimate less the tokens generated, floored at 0."""
    return max(float(estimate) - generated, 0.0)


def pending_estimate(channel, request_id: str) -> float:
    """A request's estimate still in the in-process hook channel (the scheduler drains it at the next
    step start; a request that finishes in its prefill step, e.g. a P/D prefill with ``max_tokens``
    1, is freed before that): the hook's value, read without draining (the in-process channel's
    pending batches, or the file channel's frames not yet drained: vLLM's mp executor, which the CPU
    platform picks for a served engine at every tensor parallel size); nan where there is none."""
    frames = channel.peek() if hasattr(channel, "peek") else [(ids, values) for ids, values, _ in
                                                              getattr(channel, "pending", ())]
    for ids, values in frames:
        if request_id in ids:
            return float(values[ids.index(request_id)])
    return math.nan


class _Series:
    """The two prometheus series of one engine (registered once per process; labelled by engine)."""

    _made: dict = {}

    @classmethod
    def get(cls):
        if not cls._made:
            from prometheus_client import Gauge, Histogram

            labels = ("model_name", "engine")
            cls._made["histogram"] = Histogram(
                ESTIMATE_HISTOGRAM, "LEAP's output-length estimate of each request, after its prefill.",
                labels, buckets=BUCKETS)
            cls._made["gauge"] = Gauge(
                OUTSTANDING_GAUGE, "Predicted decode tokens left over the engine's requests past prefill.",
                labels, multiprocess_mode="livesum")
        return cls._made["histogram"], cls._made["gauge"]


class EstimateMetrics:
    """The served scheduler's estimate series: observe each prefilled request once, keep the gauge."""

    def __init__(self, vllm_config):
        names = vllm_config.model_config.served_model_name
        labels = {"model_name": names if isinstance(names, str) else names[0],
                  "engine": str(vllm_config.parallel_config.data_parallel_rank)}
        histogram, gauge = _Series.get()
        self.histogram = histogram.labels(**labels)
        self.gauge = gauge.labels(**labels)
        self.gauge.set(0.0)
        self.observed: dict[str, float] = {}    # request id -> the estimate observed

    @staticmethod
    def served_note() -> str | None:
        """Why ``/metrics`` will not show the series, or None where it will."""
        from vllm import envs

        if os.environ.get(MULTIPROC_ENV) is None and envs.VLLM_ENABLE_V1_MULTIPROCESSING:
            return (f"leap_sched: {ESTIMATE_HISTOGRAM} and {OUTSTANDING_GAUGE} stay in the engine-core process: "
                    f"set {MULTIPROC_ENV} to an empty directory to serve them on /metrics")
        return None

    def observe(self, request_id: str, estimate: float) -> None:
        if request_id not in self.observed and math.isfinite(estimate):
            self.observed[request_id] = estimate
            self.histogram.observe(estimate)

    def after_step(self, scheduler) -> None:
        """Observe the requests past prefill whose estimate is in; set the gauge."""
        held = scheduler._leap_req
        for r in scheduler.running:
            rid = r.request_id
            if rid not in self.observed and r.num_output_tokens > 0 and rid in held:
                st = held[rid]
                est = st.first_predicted
                self.observe(rid, est if math.isfinite(est) else pending_estimate(scheduler.leap_channel, rid))
        self.set_gauge(scheduler)

    def set_gauge(self, scheduler) -> None:
        held, requests = scheduler._leap_req, scheduler.requests
        total = 0.0
        for rid, observed in self.observed.items():
            st, r = held.get(rid), requests.get(rid)
            if st is not None and r is not None:      # the scheduler's newest estimate once it took the first in
                total += tokens_left(st.predicted if math.isfinite(st.first_predicted) else observed,
                                     r.num_output_tokens)
        self.gauge.set(total)

    def finished(self, scheduler, request) -> float:
        """A request leaves (finished or aborted): observe it if its prefill ended unobserved; its estimate
        (nan where none) for the response. Call before the live scheduler drops its state."""
        rid = request.request_id
        st = scheduler._leap_req.get(rid)
        est = math.nan if st is None else st.first_predicted
        if not math.isfinite(est):
            est = pending_estimate(scheduler.leap_channel, rid)
        if request.num_output_tokens > 0 and request.status.name != "FINISHED_ABORTED":
            self.observe(rid, est)
        self.observed.pop(rid, None)
        return est
