"""LEAP scheduling inside vLLM V1: a Scheduler subclass loaded through ``scheduler_cls``.

Each step, before vLLM's own ``schedule()`` walks ``self.running``:

1. predictions: new LEAP estimates from the worker hook (``PredictionChannel``) are taken in; with
   leap-rls, the newest weights published by the RLS thread re-score every resident request;
2. decode choice: the residents past prefill form a :class:`policies.base.SchedulerView` (rows in
   arrival order) and :func:`policies.selection.choose_decodes` -- the simulator's own function --
   picks at most ``decode_slots`` of them: wait-cap-forced first, then the policy's keys;
3. the others get ``next_decode_eligible_step`` = the coming step + 1, vLLM's own field for
   leaving a running request out of a step (its KV blocks stay resident); ``self.running`` is
   reordered chosen-first (policy order), prefill chunks next, the rest last, so vLLM's token
   budget serves the chosen ones first and a KV preemption takes the newest unchosen request; with a
   bound KV cache (``kv_bounded``, ``leap-serve --kv-blocks``) the chosen and the unchosen are in
   :func:`policies.selection.victim_order`, so vLLM's victim is the simulator's.

Admission is vLLM's waiting queue up to ``max_num_seqs`` = the resident cap. With an arrival-stage
predictor (oracle, ssjf) and a policy that uses predictions (the simulator's ``ordered_admission``),
step 0 also re-orders the never-admitted requests in vLLM's FCFS deque by the policy's
``admission_keys`` (stable, arrival order breaks ties), behind any preempted request vLLM put back
at the front; vLLM then admits from the front as usual. (vLLM's own ``priority`` policy is not
used: its integer priority is fixed at submission, before an asynchronous score exists, and it
also changes which running request a KV shortage preempts; a request's ``priority`` as submitted
reaches the policy as a request attribute, ``SchedulerView.attributes``: ``core.attributes``.) Hidden-state predictors have no
estimate before prefill and admit FCFS. Timing per step (``leap_stats()``): ``order_s`` =
steps 1-3 (policy ordering, re-scoring, hand-off), ``predict_s`` = the hook's read-out in that
step's forward (``order_s`` includes taking in text-encoder scores and ordering admission), ``step_s`` = schedule() start to update_from_output() end.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from vllm.v1.core.sched.scheduler import Scheduler

from core.attributes import of_requests
from core.prefix_hashes import token_block_hashes
from live.config import CONFIG_KEY, LiveSchedulerConfig
from live.kv_cache import running_order
from live.predictors import make_live_predictor
from live.worker_ext import PredictionChannel
from policies import make_policy
from policies.base import SchedulerView
from policies.selection import choose_decodes, victim_order


@dataclass
class _ReqState:
    seq: int                      # arrival order: the stable tie-break (the simulator's row order)
    arrival_s: float
    predicted: float
    first_predicted: float = float("nan")
    last_served: int = -1
    feature: np.ndarray | None = None      # standardised hook vector (leap-rls)
    predicted_at_step: int = -1
    scored: bool = False                   # arrival-stage score in (async predictors)
    cached_tokens: int = -1                # prefix-cache hit at the first admission (vLLM's num_cached_tokens)


@dataclass
class _Stats:
    step: list = field(default_factory=list)
    running: list = field(default_factory=list)
    waiting: list = field(default_factory=list)
    candidates: list = field(default_factory=list)   # residents past prefill at step start
    chosen: list = field(default_factory=list)       # picked by choose_decodes
    decoded: list = field(default_factory=list)      # of those, actually scheduled by vLLM
    forced: list = field(default_factory=list)
    admitted: list = field(default_factory=list)
    unscored_admitted: list = field(default_factory=list)   # arrival predictor: admitted on the prior
    order_s: list = field(default_factory=list)
    predict_s: list = field(default_factory=list)
    step_s: list = field(default_factory=list)


def _generated(request) -> int:
    """Output tokens produced or in flight: under async scheduling a token scheduled in the step
    still running is a placeholder, so both bases see the same count at the same decision (and a
    request whose last token is in flight is done, as a finished one is in the synchronous base)."""
    return request.num_output_tokens + request.num_output_placeholders


class LeapScheduler(Scheduler):
    """vLLM's Scheduler with the project's policies deciding which residents decode each step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self._leap_read_config()
        if self.max_num_running_reqs != cfg.max_resident:
            raise ValueError(f"max_num_seqs ({self.max_num_running_reqs}) differs from the live config's "
                             f"max_resident ({cfg.max_resident})")
        self.leap_config = cfg
        self.leap_policy = make_policy(cfg.policy)
        self.leap_channel = PredictionChannel()
        self.leap_predictor = make_live_predictor(cfg)
        self._leap_orders_admission = cfg.orders_admission
        if self._leap_orders_admission and not isinstance(self.waiting, deque):
            raise ValueError("ordered admission re-sorts vLLM's FCFS waiting queue: leave scheduling_policy at "
                             "'fcfs' (or set ordered_admission=False in the live config)")
        self._leap_req: dict[str, _ReqState] = {}
        self._leap_seq = 0
        self._leap_step = -1
        self._leap_wall0 = time.time()
        self._leap_tick: int | None = None     # the step clock's tick, once the harness gives one
        self._leap_stats = _Stats()
        self._leap_t_start = 0.0
        self._leap_finished: dict[str, list] = {"request_id": [], "finish_step": [], "output_tokens": [],
                                                "first_predicted": [], "seq": [], "preemptions": [],
                                                "cached_tokens": [], "output_hashes": []}

    def _leap_read_config(self) -> LiveSchedulerConfig:
        """The live config from ``additional_config`` (the served plugin reads its own key)."""
        extra = self.vllm_config.additional_config
        raw = extra.get(CONFIG_KEY) if isinstance(extra, dict) else None
        if raw is None:
            raise ValueError(f"LeapScheduler needs additional_config[{CONFIG_KEY!r}]: build the engine "
                             "arguments with live.config.LiveSchedulerConfig(...).to_engine_args()")
        return LiveSchedulerConfig.from_dict(raw)

    # ------------------------------------------------------------------ the clock
    def leap_set_tick(self, tick: int) -> None:
        """The step clock (docs/semantics.md "Step clock"): the harness gives each tick before its
        submissions and its engine step, so a policy's clock (``SchedulerView.now``, ``arrival_s``)
        is in ticks, as in the simulator's unit-time replay; without it the clock is wall seconds."""
        self._leap_tick = int(tick)

    def _leap_now(self) -> float:
        return time.time() - self._leap_wall0 if self._leap_tick is None else float(self._leap_tick)

    # ------------------------------------------------------------------ requests
    def add_request(self, request) -> None:
        super().add_request(request)
        pred = self.leap_predictor
        arrival = float(request.arrival_time) - self._leap_wall0 if self._leap_tick is None else self._leap_now()
        st = _ReqState(seq=self._leap_seq, arrival_s=arrival,
                       predicted=pred.at_arrival(request))
        self._leap_req[request.request_id] = st
        if pred.stage == "arrival" and not pred.async_scores and not np.isnan(st.predicted):
            st.first_predicted = st.predicted
            st.scored = True
        self._leap_seq += 1

    def _free_request(self, request, delay_free_blocks: bool = False):
        rid = request.request_id
        st = self._leap_req.pop(rid, None)
        if st is not None:
            fin = self._leap_finished
            fin["request_id"].append(rid)
            fin["finish_step"].append(self._leap_step)
            fin["output_tokens"].append(int(request.num_output_tokens))
            fin["first_predicted"].append(st.first_predicted)
            fin["seq"].append(st.seq)
            fin["preemptions"].append(int(request.num_preemptions))
            fin["cached_tokens"].append(max(st.cached_tokens, 0))
            fin["output_hashes"].append(self._leap_output_hashes(request))
            if request.status.name != "FINISHED_ABORTED":
                self.leap_predictor.on_finished(st.feature, int(request.num_output_tokens))
        self.leap_channel.seen.discard(rid)
        return super()._free_request(request, delay_free_blocks)

    def _leap_output_hashes(self, request) -> list[int] | None:
        """With vLLM's prefix caching: the chained hashes of the request's full blocks past its
        prompt's, over prompt + generated tokens (``core.prefix_hashes``: vLLM names a block by its
        tokens, so a generated block may equal another request's prompt block); None without."""
        cache = self.vllm_config.cache_config
        if not cache.enable_prefix_caching:
            return None
        size = int(cache.block_size)
        return token_block_hashes(list(request.all_token_ids), size)[request.num_prompt_tokens // size:]

    # ------------------------------------------------------------------ predictions
    def _take_predictions(self) -> None:
        pred = self.leap_predictor
        if pred.async_scores:
            for rid, value in pred.take_scores():
                st = self._leap_req.get(rid)
                if st is None:
                    continue
                st.predicted = value
                st.scored = True
                if np.isnan(st.first_predicted):
                    st.first_predicted = value
                    st.predicted_at_step = self._leap_step
        for ids, values, vectors in self.leap_channel.drain():
            z = pred.standardize(vectors) if vectors is not None else None
            latest = pred.score_new(z) if z is not None else None
            if latest is not None:          # leap-rls after an update: the newest weights, as the simulator
                values = latest
            for j, rid in enumerate(ids):
                st = self._leap_req.get(rid)
                if st is None:
                    continue
                st.predicted = float(values[j])
                if np.isnan(st.first_predicted):
                    st.first_predicted = st.predicted
                    st.predicted_at_step = self._leap_step
                if z is not None:
                    st.feature = z[j]
        if pred.has_update():
            features = [(st, st.feature) for st in self._leap_req.values() if st.feature is not None]
            if features:
                states = [st for st, _ in features]
                fresh = pred.rescore(np.stack([f for _, f in features]))
                for st, v in zip(states, fresh.tolist()):
                    st.predicted = v

    def _order_admission(self, step: int) -> None:
        """Stable-sort the never-admitted waiting requests by the policy's admission keys."""
        waiting = self.waiting
        if len(waiting) < 2 or not isinstance(waiting, deque) or len(self.running) >= self.max_num_running_reqs:
            return
        reqs = list(waiting)
        fresh = [r.request_id in self._leap_req and r.num_computed_tokens == 0 and r.num_preemptions == 0
                 for r in reqs]
        new = [r for r, f in zip(reqs, fresh) if f]
        if len(new) < 2:
            return
        new.sort(key=lambda r: self._leap_req[r.request_id].seq)
        states = [self._leap_req[r.request_id] for r in new]
        n = len(new)
        view = SchedulerView(
            now=self._leap_now(),
            arrival_s=np.fromiter((s.arrival_s for s in states), dtype=np.float64, count=n),
            predicted=np.fromiter((s.predicted for s in states), dtype=np.float64, count=n),
            generated=np.zeros(n, dtype=np.int64), output_kind="length",
            step=step, last_served=np.full(n, -1, dtype=np.int64),
            first_predicted=np.fromiter((s.first_predicted for s in states), dtype=np.float64, count=n),
            attributes=of_requests(new),
            prompt=np.fromiter((r.num_prompt_tokens for r in new), dtype=np.int64, count=n))
        keys = self.leap_policy.admission_keys(view, np.arange(n))
        if keys is None:
            return
        order = np.argsort(keys, kind="stable")
        waiting.clear()
        waiting.extend([r for r, f in zip(reqs, fresh) if not f] + [new[i] for i in order.tolist()])

    # ------------------------------------------------------------------ the step
    def schedule(self, *args, **kwargs):
        t0 = time.perf_counter()
        self._leap_t_start = t0
        self._leap_step += 1
        step = self._leap_step
        cfg = self.leap_config
        if cfg.needs_hook and self.running and not self.leap_channel.installed:
            raise RuntimeError("the LEAP hook is not installed: call live.attach(engine) after building the engine")
        self._take_predictions()
        if self._leap_orders_admission:
            self._order_admission(step)
        cand: list = []
        others: list = []
        for r in self.running:      # past prefill, and not already holding its last token in flight (async)
            (cand if 0 < _generated(r) < r.max_tokens and not r.is_prefill_chunk else others).append(r)
        n_forced, chosen_idx = 0, np.empty(0, dtype=np.int64)
        if cand:
            cand.sort(key=lambda r: self._leap_req[r.request_id].seq)
            states = [self._leap_req[r.request_id] for r in cand]
            n = len(cand)
            last_served = np.fromiter((s.last_served for s in states), dtype=np.int64, count=n)
            view = SchedulerView(
                now=self._leap_now(),
                arrival_s=np.fromiter((s.arrival_s for s in states), dtype=np.float64, count=n),
                predicted=np.fromiter((s.predicted for s in states), dtype=np.float64, count=n),
                generated=np.fromiter((_generated(r) for r in cand), dtype=np.int64, count=n),
                output_kind="length", step=step,
                last_served=last_served,
                first_predicted=np.fromiter((s.first_predicted for s in states), dtype=np.float64, count=n),
                attributes=of_requests(cand),
                prompt=np.fromiter((r.num_prompt_tokens for r in cand), dtype=np.int64, count=n),
                # vLLM's hit at each one's first admission (0 with caching off), as the simulator's view
                cached=np.fromiter((max(s.cached_tokens, 0) for s in states), dtype=np.int64, count=n))
            chosen_idx, n_forced = choose_decodes(self.leap_policy, view, np.arange(n), decode_slots=cfg.decode_slots,
                                                  wait_cap=cfg.wait_cap, step=step, last_served=last_served)
            picked = np.zeros(n, dtype=bool)
            picked[chosen_idx] = True
            skip_until = self.current_step + 2        # schedule() first increments current_step
            for i, r in enumerate(cand):
                r.next_decode_eligible_step = 0 if picked[i] else skip_until
            if cfg.kv_bounded:      # vLLM preempts from the back: the simulator's victim order (live/kv_cache.py)
                spared = victim_order(self.leap_policy, view, np.arange(n), chosen_idx, n_forced).tolist()
                k = len(chosen_idx)
                self.running = running_order([cand[i] for i in spared[:k]], others, [cand[i] for i in spared[k:]])
            else:
                self.running = ([cand[i] for i in chosen_idx.tolist()] + others
                                + [r for i, r in enumerate(cand) if not picked[i]])
        order_s = time.perf_counter() - t0
        out = super().schedule(*args, **kwargs)
        scheduled = out.num_scheduled_tokens
        decoded = 0
        for i in chosen_idx.tolist():
            rid = cand[i].request_id
            if rid in scheduled:
                decoded += 1
                self._leap_req[rid].last_served = step
        admitted = unscored = 0
        for new in out.scheduled_new_reqs:
            st = self._leap_req.get(new.req_id)
            if st is not None:
                st.last_served = step
                admitted += 1
                unscored += not st.scored
                if st.cached_tokens < 0:   # the first admission: the tokens vLLM found computed (its cache hit)
                    st.cached_tokens = int(new.num_computed_tokens)
        for rid in getattr(out.scheduled_cached_reqs, "resumed_req_ids", ()) or ():
            st = self._leap_req.get(rid)
            if st is not None:
                st.last_served = step
        s = self._leap_stats
        s.step.append(step)
        s.running.append(len(self.running))
        s.waiting.append(len(self.waiting))
        s.candidates.append(len(cand))
        s.chosen.append(len(chosen_idx))
        s.decoded.append(decoded)
        s.forced.append(int(n_forced))
        s.admitted.append(admitted)
        s.unscored_admitted.append(unscored if self.leap_predictor.stage == "arrival" else 0)
        s.order_s.append(order_s)
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        out = super().update_from_output(scheduler_output, model_runner_output)
        s = self._leap_stats
        if len(s.predict_s) < len(s.step):        # the forward of the step just scheduled has run
            s.predict_s.append(self.leap_channel.take_hook_s())
            s.step_s.append(time.perf_counter() - self._leap_t_start)
        return out

    # ------------------------------------------------------------------ read-outs for drivers
    def leap_stats(self) -> dict[str, list]:
        """Per-step record (plain lists of equal length): step, running, waiting, candidates, chosen,
        decoded, forced, admitted, unscored_admitted (arrival predictors: admitted before the score
        landed), order_s, predict_s, step_s (the last two lag one call until the
        step's output is processed, so a snapshot mid-run trims to the completed steps)."""
        s = self._leap_stats
        n = len(s.step_s)
        return {k: list(v[:n]) for k, v in s.__dict__.items()}

    def leap_requests(self) -> dict[str, list]:
        """Per finished request: engine id, the step it finished in, output tokens, first estimate."""
        return {k: list(v) for k, v in self._leap_finished.items()}

    def leap_predictor_stats(self) -> dict:
        return self.leap_predictor.stats()

    def shutdown(self) -> None:
        self.leap_predictor.close()
        super().shutdown()
