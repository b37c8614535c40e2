"""The compiled step's parts, each beside its twin in the reference engine.

:func:`simulator.kernel._run_steps` runs one step as the reference's ``Simulation._step_loop``
does: compose it (:func:`_compose`: decode choice, admission, prefill; ``Scheduler.compose``),
note the estimates in use, time it, land its tokens (:func:`_land`) and retire what finished
(:func:`_retire`). Each function names its twin in ``simulator/scheduler.py``,
``simulator/requests.py``, ``simulator/prediction.py`` or ``policies/``; the semantics are
``docs/semantics.md``'s. Every part takes the run's rows ``t``, working arrays ``w``, settings ``s``,
counters ``st`` and step ``b`` (:mod:`simulator.kernel_layout`). Plain Python that numba compiles.
"""

from __future__ import annotations

from simulator.kernel_float import _pairwise
from simulator.kernel_kv import _blocks_for, _kv_grow
from simulator.kernel_layout import KEY_ROW, PRED_NONE, PRED_PREFILL, PRED_STATIC
from simulator.kernel_order import _heap_pop, _heap_push, _lru_append, _lru_remove, _ord_insert
from simulator.kernel_policies import (
    _admission_key,
    _aging_clock,
    _aging_tick,
    _decode_key,
    _ltr_admission_keys,
    _ltr_decode_keys,
    _policy_rekey_sort,
)
from simulator.kernel_prefix import _pk_admit, _pk_lookup, _pk_release
from simulator.kernel_rank import _rank, _starving


def _score_arrivals(t, w, s, st):
    """PredictionDriver.score_arrivals: arrival-stage scores of the rows arrived by now become usable
    (fixed per row: written here; else Python wrote them) and join the admission heap."""
    while st.scored < st.arrived:
        r = st.scored
        if s.pred_mode == PRED_STATIC:
            t.first_predicted[r] = t.predicted[r]
            t.ready_s[r] = st.now
        if s.pred_mode != PRED_NONE and s.ordered:
            st.heap = _heap_push(w.heap_keys, w.heap_rows, st.heap, _admission_key(r, t, w, s, st), r)
        st.scored = r + 1


def _choose_decodes(t, w, s, st, b):
    """policies.selection.choose_decodes: the rows decoded this step (``chosen[:n_chosen]``), those
    the wait cap forced first; the longest-starved win when more starve than there are slots."""
    n_res, slots, step, chosen = st.n_res, s.decode_slots, st.step, w.chosen
    b.ord_dirty = n_res
    if n_res <= slots:
        for j in range(n_res):
            chosen[j] = w.resident[j]
        b.n_chosen, b.n_forced = n_res, 0
        return
    n_forced, n_other = 0, 0
    # the least recently served resident heads the LRU list: nobody starves unless it does
    if s.wait_cap and step - t.last_served[st.lru_head] > s.wait_cap:
        for j in range(n_res):
            r = w.resident[j]
            if step - t.last_served[r] > s.wait_cap:
                chosen[n_forced] = r
                n_forced += 1
            else:
                w.scratch[n_other] = r
                n_other += 1
    if n_forced >= slots:   # stable sort by last service (insertion sort), the first `slots` win
        for a in range(1, n_forced):
            r = chosen[a]
            c = a - 1
            while c >= 0 and t.last_served[chosen[c]] > t.last_served[r]:
                chosen[c + 1] = chosen[c]
                c -= 1
            chosen[c + 1] = r
        b.n_chosen, b.n_forced = slots, slots
    elif n_forced:
        k = min(slots - n_forced, n_other)
        if s.promotes:   # the policy is asked for the keys of the rows not forced
            _ltr_decode_keys(t, w, s, st, w.scratch, n_other)
        _rank(t, w, s, st, w.scratch, n_other, n_forced, k, True, w.chosen)
        b.n_chosen, b.n_forced = n_forced + k, n_forced
    else:
        if s.promotes:
            _ltr_decode_keys(t, w, s, st, w.resident, n_res)
        if _rank(t, w, s, st, w.resident, n_res, 0, slots, False, w.chosen):
            b.ord_dirty = slots   # only the prefix's keys change this step
        b.n_chosen, b.n_forced = slots, 0


def _admit(t, w, s, st, b):
    """Scheduler._admit: waiting rows in row order (or by score, from the heap) up to the prefill
    budget, resident room and KV budget; strict order, an over-long prompt alone (or, chunked, the
    last one takes what budget is left as a first chunk; SSJF's override: by arrival when the first
    waiting row starves, those rows left in the heap until it pops them). Into ``admit[:n_admit]``.
    KV blocks: only in a step that preempted nothing; the re-queued rows first (the last preempted
    first, into ``readmit[:n_readmit]``), and each needs its whole fill's blocks free."""
    budget, n_admit, n_re = b.budget, 0, 0
    room = s.max_resident - st.n_res - (1 if st.partial >= 0 else 0)
    waiting = st.n_admitted < st.arrived
    if budget > 0 and room > 0 and (waiting or st.n_requeued > 0) and b.n_preempted == 0:
        tokens, by_row, nxt = 0, not s.ordered, st.n_admitted
        if s.ordered and s.promotes and waiting:   # the policy is asked for every waiting row's key
            _ltr_admission_keys(t, w, s, st)
        if s.ordered and s.starvation_override and waiting:
            while t.admitted[st.admit_ptr]:
                st.admit_ptr += 1
            by_row, nxt = _starving(t, s, st.now, st.admit_ptr), st.admit_ptr
        q, blocks, free = st.n_requeued, 0, s.kv_total - st.kv_blocks_used
        while n_re + n_admit < room:
            if q > 0:   # a preempted row, readmitted
                r = w.kv_requeue[q - 1]
            elif by_row:
                while nxt < st.arrived and t.admitted[nxt]:
                    nxt += 1
                if nxt >= st.arrived:
                    break
                r = nxt
            else:
                while st.heap > 0 and t.admitted[w.heap_rows[0]]:   # admitted by arrival before
                    st.heap = _heap_pop(w.heap_keys, w.heap_rows, st.heap)
                if st.heap == 0:
                    break
                r = w.heap_rows[0]
            n_hit = _pk_lookup(w, s, r, t.fill[r]) if s.kv_caches else 0   # its cached blocks, shared
            c = tokens + t.fill[r] - n_hit * s.kv_size
            last = False
            if c > budget:
                if s.chunked:   # the next one gets what budget is left, as a first chunk
                    if tokens < budget:
                        last = True
                    else:
                        break
                elif n_re + n_admit > 0:   # strict order; an over-long prompt goes alone
                    break
            if s.kv_budget >= 0 and c > s.kv_budget - st.kv_used and not (n_admit == 0 and st.n_res == 0):
                break
            if s.kv_caches:   # PrefixKVBlocks.admit: the blocks past its hit, held at once
                if not _pk_admit(t, w, s, st, r, n_hit):
                    break
            elif s.kv_total > 0:   # KVBlocks.admissible: its whole fill's blocks
                need = _blocks_for(t.fill[r], s.kv_size)
                if blocks + need > free:
                    break
                blocks += need
                w.kv_held[r] = need
            if q > 0:
                q -= 1
                w.readmit[n_re] = r
                n_re += 1
            else:
                if by_row:
                    nxt = r + 1
                else:
                    st.heap = _heap_pop(w.heap_keys, w.heap_rows, st.heap)
                w.admit[n_admit] = r
                n_admit += 1
            tokens = c
            if last:
                break
        for j in range(n_admit):
            t.admitted[w.admit[j]] = True
        st.n_admitted += n_admit
        st.n_requeued = q
        st.kv_blocks_used += blocks
    b.n_admit, b.n_readmit = n_admit, n_re


def _prefilled_row(w, b, j):
    """The ``j``-th row prefilled from scratch this step: the readmitted first, then the admitted."""
    return w.readmit[j] if j < b.n_readmit else w.admit[j - b.n_readmit]


def _completed(w, s, b, r, n_first):
    """Row ``r``'s prefill completed: a first token, or (KVBlocks.completed) a re-prefill resumed."""
    if s.kv_total > 0 and w.kv_recompute[r]:
        w.kv_recompute[r] = False
        w.resumed[b.n_resumed] = r
        b.n_resumed += 1
        return n_first
    w.firsts[n_first] = r
    return n_first + 1


def _prefill(t, w, s, st, b):
    """Scheduler._prefill: tokens computed this step (the carried chunk, then each readmitted and
    admitted row's chunk of its fill); rows whose prompt completes emit their first token
    (``firsts[:n_first]``), completed re-prefills their next one (``resumed[:n_resumed]``)."""
    carried, chunk_c = b.carried, b.carried_chunk
    tokens, sq, n_first = 0, 0, 0
    n_all = b.n_readmit + b.n_admit
    b.n_resumed = 0
    if not s.chunked:
        for j in range(n_all):
            r = _prefilled_row(w, b, j)
            p = t.fill[r] - (w.pk_start[r] if s.kv_caches else 0)   # past its cached tokens
            tokens += p
            sq += p * t.fill[r]
            n_first = _completed(w, s, b, r, n_first)
        b.prefill_tokens, b.prefill_sq, b.n_first = tokens, sq, n_first
        return
    before = t.prefilled[carried] if carried >= 0 else 0
    tokens, sq = chunk_c, chunk_c * (before + chunk_c)
    if carried >= 0:
        t.prefilled[carried] += chunk_c
        if t.prefilled[carried] == t.fill[carried]:
            n_first = _completed(w, s, b, carried, n_first)
            st.partial = -1
    cum, chunk, p, r = 0, 0, 0, -1
    for j in range(n_all):
        r = _prefilled_row(w, b, j)
        cached = w.pk_start[r] if s.kv_caches else 0   # the prefill starts past its cached tokens
        p = t.fill[r] - cached
        rest = b.budget - cum
        if rest < 0:
            rest = 0
        chunk = p if p < rest else rest
        cum += p
        t.prefilled[r] = cached + chunk
        tokens += chunk
        sq += chunk * (cached + chunk)
        if chunk == p:
            n_first = _completed(w, s, b, r, n_first)
    if n_all and chunk < p:
        st.partial = r
        st.carried_chunks = 0
    b.prefill_tokens, b.prefill_sq, b.n_first = tokens, sq, n_first


def _compose(t, w, s, st, b):
    """Scheduler.compose: decode choice, the prefill budget left (a carried chunk first), admission,
    prefill, the decodes' context. False when the step would make no progress (SimulationStalled:
    ``stall_ready`` / ``stall_waiting`` say why, a carried row as ``-1 - row``)."""
    if s.aging and _aging_clock(st.now, s.aging_every_s) != st.aging_clock:
        _aging_tick(t, w, s, st, _aging_clock(st.now, s.aging_every_s))
    b.ready = st.n_res
    _choose_decodes(t, w, s, st, b)
    b.n_preempted = 0
    if s.kv_total > 0:   # Scheduler._grow: the decodes' blocks (the preempted leave)
        _kv_grow(t, w, s, st, b)
    budget = s.prefill_budget - (b.n_chosen if s.decodes_in_budget else 0)
    carried, chunk_c = st.partial, 0
    if carried >= 0:   # a partly prefilled prompt continues before new admissions
        left = t.fill[carried] - t.prefilled[carried]
        room = budget if budget > 0 else 0
        chunk_c = left if left < room else room
        budget -= chunk_c
    b.budget, b.carried, b.carried_chunk = budget, carried, chunk_c
    b.waiting = st.arrived - st.n_admitted + st.n_requeued
    _admit(t, w, s, st, b)
    progress = b.n_admit + b.n_readmit + b.n_chosen + b.n_preempted   # besides the carried chunk
    if progress == 0 and chunk_c == 0:
        st.stall_ready, st.stall_waiting = b.ready, b.waiting
        return False
    if b.ready > s.decode_slots or (s.ordered and st.arrived > st.n_admitted) or b.n_preempted:
        st.contended += 1
    before = t.prefilled[carried] if carried >= 0 else 0
    if chunk_c > 0:   # before _prefill, which restarts the count for a new partial row
        st.carried_chunks += 1
    _prefill(t, w, s, st, b)
    if progress == 0 and carried >= 0 and t.prefilled[carried] <= before:
        st.stall_ready, st.stall_waiting = -1 - carried, before   # a carried chunk that computed nothing
        return False
    least = s.prefill_budget - (s.decode_slots if s.decodes_in_budget else 0)   # scheduler.min_chunk
    least = least if least > 1 else 1
    if chunk_c > 0 and st.carried_chunks > (t.fill[carried] + least - 1) // least:
        st.chunk_overrun = 1   # scheduler.chunk_overrun: continued more often than its prompt allows
        return False
    context, gen_sum = 0, 0
    for j in range(b.n_chosen):
        context += t.prompt[w.chosen[j]]
    for j in range(b.n_chosen):
        gen_sum += t.generated[w.chosen[j]]
    b.context = context + gen_sum
    return True


def _note_decodes(t, w, s, st, b):
    """PredictionDriver.note_decodes: the error of the estimates in use, summed as numpy sums."""
    n = b.n_chosen
    if s.pred_mode != PRED_NONE and n:
        for j in range(n):
            w.err[j] = abs(t.predicted[w.chosen[j]] - t.length[w.chosen[j]])
        st.abs_error += _pairwise(w.err, 0, n, w.pair_stack, w.pair_sums)
        st.decodes += n


def _finish(t, w, st, r, n_done, end, tick):
    """RequestTable.retire's finish of row ``r`` (its KV freed); returns the finished count of the step."""
    t.finish_s[r] = end
    t.finish_step[r] = tick
    w.done_rows[n_done] = r
    st.kv_used -= t.prompt[r] + t.length[r]
    return n_done + 1


def _land(t, w, s, st, b, step, tick, start, end):
    """RequestTable.land (and retire's finish times): decode tokens, admissions, first tokens and
    resumed re-prefills' next tokens land at the step's end; rows done are ``done_rows[:n_done]``,
    decoded ones first, then first tokens, then resumed (their KV blocks freed: KVBlocks.release)."""
    n_done = 0
    for j in range(b.n_chosen):
        r = w.chosen[j]
        t.generated[r] += 1
        t.last_served[r] = step
        if j < b.n_forced:
            t.forced_steps[r] += 1
    st.kv_used += b.n_chosen
    for j in range(b.n_chosen):
        r = w.chosen[j]
        if t.generated[r] >= t.length[r]:
            n_done = _finish(t, w, st, r, n_done, end, tick)
    for j in range(b.n_admit):
        t.admit_s[w.admit[j]] = start
        t.admit_step[w.admit[j]] = tick
    st.kv_used += b.prefill_tokens
    for j in range(b.n_first):   # prompts completed this step emit their first token
        r = w.firsts[j]
        t.first_token_s[r] = end
        t.first_token_step[r] = tick
        t.generated[r] = 1
        t.last_served[r] = step
    st.kv_used += b.n_first
    for j in range(b.n_first):
        r = w.firsts[j]
        if t.length[r] <= 1:
            n_done = _finish(t, w, st, r, n_done, end, tick)
    for j in range(b.n_resumed):   # a re-prefill emits its next token (not a first one)
        r = w.resumed[j]
        t.generated[r] += 1
        t.last_served[r] = step
    for j in range(b.n_resumed):
        r = w.resumed[j]
        if t.generated[r] >= t.length[r]:
            n_done = _finish(t, w, st, r, n_done, end, tick)
    if s.kv_caches:   # PrefixKVBlocks.release, in the order they finished
        for j in range(n_done):
            _pk_release(t, w, s, st, w.done_rows[j])
    elif s.kv_total > 0:
        for j in range(n_done):
            r = w.done_rows[j]
            st.kv_blocks_used -= w.kv_held[r]
            w.kv_held[r] = 0
    st.finished += n_done
    b.n_done = n_done


def _retire(t, w, st, b, end):
    """RequestTable.retire: the finished leave the residents, completed prompts join them (row
    order), and in a closed loop each completion submits the next row at ``end``."""
    n_res = st.n_res
    if b.n_done:
        m = 0
        for j in range(n_res):
            r = w.resident[j]
            if not (t.finish_s[r] == t.finish_s[r]):   # still running (nan finish time)
                w.resident[m] = r
                m += 1
        n_res = m
    n_new = 0
    for j in range(b.n_first + b.n_resumed):   # insertion sort of the new rows (few per step)
        r = w.firsts[j] if j < b.n_first else w.resumed[j - b.n_first]
        if not (t.finish_s[r] == t.finish_s[r]):
            c = n_new - 1
            while c >= 0 and w.scratch[c] > r:
                w.scratch[c + 1] = w.scratch[c]
                c -= 1
            w.scratch[c + 1] = r
            n_new += 1
    if n_new:   # merge them in from the back
        a, c, m = n_res - 1, n_new - 1, n_res + n_new - 1
        while c >= 0:
            if a >= 0 and w.resident[a] > w.scratch[c]:
                w.resident[m] = w.resident[a]
                a -= 1
            else:
                w.resident[m] = w.scratch[c]
                c -= 1
            m -= 1
        n_res += n_new
    st.n_res = n_res
    n = t.arrival.shape[0]
    b.n_released = 0
    if st.released < n and b.n_done:
        fresh = min(b.n_done, n - st.released)
        for j in range(st.released, st.released + fresh):
            t.arrival[j] = end
        st.released += fresh
        b.n_released = fresh


def _reorder(t, w, s, st, b, n_before):
    """The kernel's standing orders after a step (no twin: the reference re-sorts every step):
    served rows to the tail of the list by last service and the finished out; ``ord_rows`` re-keyed
    where keys fell (the decoded rows), finished rows dropped, completed prompts inserted."""
    head, tail = st.lru_head, st.lru_tail
    for j in range(b.n_chosen):
        r = w.chosen[j]
        running = not (t.finish_s[r] == t.finish_s[r])
        if not running or r != tail:
            head, tail = _lru_remove(r, w.lru_prev, w.lru_next, head, tail)
            if running:
                head, tail = _lru_append(r, w.lru_prev, w.lru_next, head, tail)
    n_new = b.n_first + b.n_resumed
    for j in range(n_new):   # completed prompts, then resumed re-prefills
        r = w.firsts[j] if j < b.n_first else w.resumed[j - b.n_first]
        if not (t.finish_s[r] == t.finish_s[r]):
            head, tail = _lru_append(r, w.lru_prev, w.lru_next, head, tail)
    st.lru_head, st.lru_tail = head, tail
    if s.keys_on == KEY_ROW:
        return
    n_ord = n_before - b.n_preempted   # the preempted left ord_rows when they were preempted
    # keys only fall, and only in the decoded prefix (all rows where the choice was not a prefix);
    # a policy whose keys may rise (CompiledForm.keys_rise) re-sorts every resident
    _policy_rekey_sort(t, w, s, st, n_ord if s.keys_rise else min(b.ord_dirty, n_ord))
    if b.n_done:
        m = 0
        for i in range(n_ord):
            r = w.ord_rows[i]
            if not (t.finish_s[r] == t.finish_s[r]):
                w.ord_rows[m], w.ord_keys[m] = r, w.ord_keys[i]
                m += 1
        n_ord = m
    for j in range(n_new):
        r = w.firsts[j] if j < b.n_first else w.resumed[j - b.n_first]
        if t.finish_s[r] == t.finish_s[r]:
            continue
        _ord_insert(w.ord_keys, w.ord_rows, n_ord, _decode_key(r, t, w, s, st), r)
        n_ord += 1


def _python_due(t, w, s, st, b):
    """Whether Python's part of the step just landed is due (PredictionDriver.after_step and
    .feedback): estimates from its prefill, a decode-time refresh (a decoded row reached a multiple
    of ``refresh_every`` tokens, simulator.prediction.refresh_due), or a full feedback batch (the
    finished rows are buffered here, grouped by step)."""
    fb_due = False
    if s.feedback_batch and b.n_done:
        for j in range(b.n_done):
            w.fb_rows[st.fb_n + j] = w.done_rows[j]
        st.fb_n += b.n_done
        w.fb_ends[st.fb_groups] = st.fb_n
        st.fb_groups += 1
        fb_due = st.fb_n >= s.feedback_batch
    refresh = False
    if s.refresh_every:
        for j in range(b.n_chosen):
            r = w.chosen[j]
            if t.generated[r] % s.refresh_every == 0 and t.generated[r] < t.length[r]:
                refresh = True
                break
    prefill = (s.pred_mode == PRED_PREFILL or s.after_prefill) and b.n_first > 0
    return prefill or refresh or fb_due


JITTED = ("_score_arrivals", "_choose_decodes", "_prefilled_row", "_completed",
          "_admit", "_prefill", "_compose", "_note_decodes", "_finish", "_land", "_retire", "_reorder", "_python_due")
