"""The served scheduler's stats, written as one log line in vLLM's log (the engine-core process).

A summary line every ``log_interval_s`` seconds while requests run (vLLM's own stats log
interval by default) and once whenever the engine turns idle:

    leap_sched: countdown/leap-rls, 2 of 8 decode: 131 steps, 8 finished (8 estimated by the hook,
    0 on the prior), 96 decodes held back, 3 forced by the wait cap, ordering 0.21 ms median /
    0.90 ms max (0.8% of step time), RLS updates 4 published, 0 requests held

("N requests held": the requests in the scheduler's own per-request state, 0 once the engine is
idle: finished, aborted and disconnected requests all leave it)

and, from the RLS thread, one line per published update (``leap_sched: RLS update 3 published ...``).
The per-step lists the scheduler keeps (``leap_stats()``, ``leap_requests()``) are consumed here
and then dropped, so a long-running server does not grow them.
"""

from __future__ import annotations

import math
import time

import numpy as np
from vllm.logger import init_logger

logger = init_logger("vllm.leap_sched")


class StatsLog:
    def __init__(self, scheduler, interval_s: float):
        self.interval_s = float(interval_s)
        self.last_log = time.monotonic()
        cfg = scheduler.leap_config
        self.label = f"{cfg.policy}/{cfg.predictor}, {cfg.decode_slots} of {cfg.max_resident} decode"
        self.source = "the hook" if cfg.needs_hook else "arrival" if cfg.form.has_predictor else None
        self._reset()
        pred = scheduler.leap_predictor
        if hasattr(pred, "on_publish"):
            pred.on_publish = self._published

    def started(self, scheduler, base: type) -> None:
        cfg = scheduler.leap_config
        hook = f", hook on layer {cfg.hook_layer} ({cfg.readout})" if cfg.needs_hook else ""
        logger.info("leap_sched: %s, over vLLM's %s, wait cap %d%s", self.label, base.__name__, cfg.wait_cap, hook)

    @staticmethod
    def note(text: str) -> None:
        logger.warning("%s", text)

    def _reset(self) -> None:
        self.steps = self.finished = self.estimated = self.held = self.forced = 0
        self.order_s: list[float] = []
        self.step_s = 0.0

    @staticmethod
    def _published(version: int, rows: int, cpu_s: float) -> None:
        logger.info("leap_sched: RLS update %d published (%d requests, %.2f ms CPU)", version, rows, cpu_s * 1e3)

    def after_step(self, scheduler) -> None:
        """Fold the completed steps into the running totals; log when due or when the engine went idle."""
        if not self.steps:              # a busy period starts: the interval counts from its first step
            self.last_log = time.monotonic()
        self._consume(scheduler)
        idle = not scheduler.has_requests()
        due = self.interval_s > 0 and time.monotonic() - self.last_log >= self.interval_s
        if self.steps and (idle or due):
            logger.info("%s", self.line(scheduler))
            self.last_log = time.monotonic()
            self._reset()

    def _consume(self, scheduler) -> None:
        s = scheduler._leap_stats
        n = len(s.step_s)
        if n:
            cand, decoded = np.asarray(s.candidates[:n]), np.asarray(s.decoded[:n])
            self.steps += n
            self.held += int((cand - decoded).sum())
            self.forced += int(sum(s.forced[:n]))
            self.order_s.extend(s.order_s[:n])
            self.step_s += float(sum(s.step_s[:n]))
            for values in s.__dict__.values():
                del values[:n]
        fin = scheduler._leap_finished
        first = fin["first_predicted"]
        if first:
            self.finished += len(first)
            self.estimated += sum(1 for v in first if v is not None and math.isfinite(v))
            for values in fin.values():
                values.clear()

    def line(self, scheduler) -> str:
        order = np.asarray(self.order_s) * 1e3
        share = 100.0 * float(np.sum(self.order_s)) / self.step_s if self.step_s > 0 else float("nan")
        estimates = (f" ({self.estimated} estimated by {self.source}, {self.finished - self.estimated} on the prior)"
                     if self.source else "")
        text = (f"leap_sched: {self.label}: {self.steps} steps, {self.finished} finished{estimates}, "
                f"{self.held} decodes held back, {self.forced} forced by the wait cap, ordering "
                f"{np.median(order):.2f} ms median / {order.max():.2f} ms max ({share:.1f}% of step time)")
        stats = scheduler.leap_predictor_stats()
        if "updates_published" in stats:
            text += f", RLS updates {stats['updates_published']} published"
        return text + f", {len(scheduler._leap_req)} requests held"
