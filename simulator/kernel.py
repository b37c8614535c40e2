"""The compiled step's kernel: the engine's step loop as plain Python that numba compiles.

:func:`_run_steps` advances the engine up to a number of steps over the run's arrays, in place, and
returns to Python (:mod:`simulator.compiled`) whenever a step needs it: rows to score at arrival,
Python's part of a step just landed (prefill estimates, refreshes, feedback), an event due between
steps, a stall. It replays :mod:`simulator.engine` with the same float64 arithmetic in the same
order (CPython's ``math.hypot`` and numpy's pairwise sum are replicated below), so outputs are
byte-identical.

The kernel keeps the resident set in row order and, for countdown, also in a persistent array sorted
by (key, row) (the reference's stable argsort order): a step decodes its prefix, whose keys are the
only ones that fall, so re-sorting the prefix keeps the order (no full sort per step). The residents
also sit in a list by last service, so the wait cap's starvation scan runs only when its head starves.
Waiting requests of a policy-ordered admission sit in a persistent heap keyed by (predicted, row).
It counts the step loop's SimPy timeouts (steps and idle waits), so an event at exactly a step's
end is placed as SimPy places it (see :mod:`simulator.compiled`).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os

import numpy as np

from policies.countdown import REMAINING_FLOOR

PROFILE_UNIT, PROFILE_ROOFLINE, PROFILE_FITTED = 0, 1, 2

# integer state slots
S_STEP, S_FINISHED, S_ARRIVED, S_SCORED, S_N_ADMITTED, S_N_RES, S_KV_USED, S_HEAP, S_CONTENDED, \
    S_DECODES, S_STATUS, S_STALL_READY, S_STALL_WAITING, S_PY_SCORED, S_PARTIAL, S_RELEASED, \
    S_LRU_HEAD, S_LRU_TAIL, S_REKEY, S_N_FIRST, S_DONE_LAST, S_YIELDS, S_NEXT_YB, S_FB_N, S_FB_GROUPS, \
    S_FB_BATCH, S_N_CHOSEN, S_REFRESH_EVERY, S_AFTER_PREFILL = range(29)
N_INT_STATE = 29
# float state slots
F_NOW, F_ABS_ERROR, F_CHARGE, F_NEXT_EVENT, F_START, F_DURATION, F_GPU_S = range(7)
N_FLOAT_STATE = 7
# kernel exit status (AFTER_STEP: Python's part of the step just landed: prefill estimates, feedback)
DONE_OR_CHUNK, STALLED, NEEDS_SCORES, AFTER_STEP, NEEDS_EVENT = 0, 1, 2, 3, 4
REKEY_RESORT = 16                # more re-estimated rows than this: re-key every resident and re-sort
# decode keys: row order (FCFS), countdown's remaining length, a rank predictor's static score
KEY_ROW, KEY_REMAINING, KEY_SCORE = 0, 1, 2
# how estimates reach the kernel
PRED_NONE, PRED_STATIC, PRED_PYTHON, PRED_PREFILL = 0, 1, 2, 3


# ----------------------------------------------------------------------------------------------
# kernel helpers (plain Python: numba compiles them; CPython's and numpy's float rules replicated)

def _dl_split(x):
    t = x * 134217729.0
    hi = t - (t - x)
    return hi, x - hi


def _dl_mul(x, y):
    xh, xl = _dl_split(x)
    yh, yl = _dl_split(y)
    p = xh * yh
    q = xh * yl + xl * yh
    z = p + q
    zz = p - z + q + xl * yl
    return z, zz


def _py_hypot(a, b):
    """CPython 3.11's math.hypot of two finite floats (vector_norm), bit for bit."""
    a, b = abs(a), abs(b)
    mx = a if a > b else b
    if mx == 0.0:
        return mx
    _, max_e = math.frexp(mx)
    if max_e < -1023:
        return math.hypot(a, b)     # subnormal range: not reached by step times
    scale = math.ldexp(1.0, -max_e)
    csum, frac1, frac2 = 1.0, 0.0, 0.0
    for x in (a, b):
        x *= scale
        ph, pl = _dl_mul(x, x)
        s = csum + ph
        sl = (csum - s) + ph
        csum = s
        frac1 += pl
        frac2 += sl
    h = math.sqrt(csum - 1.0 + (frac1 + frac2))
    ph, pl = _dl_mul(-h, h)
    s = csum + ph
    sl = (csum - s) + ph
    csum = s
    frac1 += pl
    frac2 += sl
    x = csum - 1.0 + (frac1 + frac2)
    h += x / (2.0 * h)
    return h / scale


def _pairwise(a, lo, n):
    """numpy's pairwise float64 sum of a[lo:lo+n] (its add.reduce of a contiguous array). numpy
    recurses on halves above 128; here that walk runs on a stack (the same additions in the same
    order), because numba cannot reload a cached recursive function (it segfaults, numba#6061)."""
    if n <= 128:
        return _pairwise_block(a, lo, n)
    starts, sizes = np.empty(64, np.int64), np.empty(64, np.int64)   # depth < 64 for any int64 n
    stages, sums = np.zeros(64, np.int64), np.empty(64, np.float64)
    starts[0], sizes[0], top, n_sums = lo, n, 0, 0
    while top >= 0:
        m = sizes[top]
        if m <= 128:
            sums[n_sums] = _pairwise_block(a, starts[top], m)
            n_sums += 1
            top -= 1
            continue
        n2 = m // 2
        n2 -= n2 % 8
        if stages[top] < 2:                    # push the left half, then the right one
            first = stages[top] == 0
            stages[top] += 1
            starts[top + 1] = starts[top] if first else starts[top] + n2
            sizes[top + 1] = n2 if first else m - n2
            stages[top + 1] = 0
            top += 1
        else:                                  # both halves summed: left + right, as numpy adds them
            sums[n_sums - 2] = sums[n_sums - 2] + sums[n_sums - 1]
            n_sums -= 1
            top -= 1
    return sums[0]


def _pairwise_block(a, lo, n):
    """numpy's sum of at most 128 values: in order below 8, else eight interleaved partial sums."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - (n % 8):
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


def _step_time(kind, pi, pf, prefill_tokens, prefill_sq, decode_batch, decode_context):
    if kind == PROFILE_ROOFLINE:
        tokens = prefill_tokens + decode_batch
        mem = float(pi[0] + pi[1] * decode_context) / pf[0]
        comp = (pf[1] * tokens + pf[2] * decode_batch + pf[3] * prefill_sq + pf[4] * decode_context) / pf[5]
        return pf[6] + _py_hypot(mem, comp)
    if kind == PROFILE_FITTED:
        t = pf[0] + pf[1] * prefill_tokens + pf[2] * decode_batch + pf[3] * decode_context + pf[4] * prefill_sq
        return t if t > 1e-9 else 1e-9
    return 1.0


def _key(r, keys_on, predicted, generated):
    """The policy's decode key of row r (policies.countdown.remaining)."""
    if keys_on == KEY_SCORE:
        return predicted[r]
    key = predicted[r] - generated[r]
    return key if key > REMAINING_FLOOR else REMAINING_FLOOR


def _locked(r, step, lock_c, last_served, generated, first_predicted):
    """policies.trail_preemption: past c x its first estimate and decoded in the previous step."""
    return last_served[r] == step - 1 and generated[r] > lock_c * first_predicted[r]


def _before(ka, ra, kb, rb):
    """(key, row) order: the reference's stable sort by key, ties in row order."""
    return ka < kb or (ka == kb and ra < rb)


def _rekey_sort(ord_keys, ord_rows, n, keys_on, predicted, generated):
    """Re-key ``ord_rows[:n]`` and restore its (key, row) order by insertion sort: near linear when
    the keys moved little (a decoded prefix, an online update's small shift)."""
    for i in range(n):
        ord_keys[i] = _key(ord_rows[i], keys_on, predicted, generated)
    for a in range(1, n):
        kr, rr = ord_keys[a], ord_rows[a]
        b = a - 1
        while b >= 0 and _before(kr, rr, ord_keys[b], ord_rows[b]):
            ord_keys[b + 1], ord_rows[b + 1] = ord_keys[b], ord_rows[b]
            b -= 1
        ord_keys[b + 1], ord_rows[b + 1] = kr, rr


def _ord_insert(ord_keys, ord_rows, n, kr, r):
    """Insert row ``r`` with key ``kr`` into the (key, row)-sorted ``ord_rows[:n]`` (binary search)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if _before(ord_keys[mid], ord_rows[mid], kr, r):
            lo = mid + 1
        else:
            hi = mid
    for i in range(n, lo, -1):
        ord_keys[i], ord_rows[i] = ord_keys[i - 1], ord_rows[i - 1]
    ord_keys[lo], ord_rows[lo] = kr, r


def _lru_append(r, lru_prev, lru_next, head, tail):
    """Row ``r`` to the tail of the residents' list by last service; returns (head, tail)."""
    lru_prev[r], lru_next[r] = tail, -1
    if tail >= 0:
        lru_next[tail] = r
    else:
        head = r
    return head, r


def _heap_push(hk, hr, size, key, row):
    i = size
    hk[i], hr[i] = key, row
    while i > 0:
        parent = (i - 1) // 2
        if _before(hk[i], hr[i], hk[parent], hr[parent]):
            hk[i], hk[parent] = hk[parent], hk[i]
            hr[i], hr[parent] = hr[parent], hr[i]
            i = parent
        else:
            break
    return size + 1


def _heap_pop(hk, hr, size):
    """Remove the root of a min-heap by (key, row); returns the new size."""
    size -= 1
    hk[0], hr[0] = hk[size], hr[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        if left + 1 < size and _before(hk[left + 1], hr[left + 1], hk[left], hr[left]):
            child = left + 1
        if _before(hk[child], hr[child], hk[i], hr[i]):
            hk[i], hk[child] = hk[child], hk[i]
            hr[i], hr[child] = hr[child], hr[i]
            i = child
        else:
            break
    return size


def _run_steps(max_steps, arrival, prompt, length, predicted, pred_mode, ordered, keys_on,
               decode_slots, wait_cap, prefill_budget, decodes_in_budget, kv_budget, max_resident, chunked,
               lock_c, kind, pi, pf, step_clock,
               generated, last_served, forced_steps, admitted, admit_s, first_token_s, finish_s,
               admit_step, first_token_step, finish_step,
               first_predicted, ready_s, prefilled, resident, hk, hr, scratch_rows, chosen, admit, firsts,
               err, ord_rows, ord_keys, lru_prev, lru_next, rekey, done_rows, fb_rows, fb_ends, gc, ist, fst):
    """Advance the engine up to ``max_steps`` steps (``simulator.engine.Simulation._step_loop``)."""
    n = arrival.shape[0]
    step, finished, arrived, scored = ist[S_STEP], ist[S_FINISHED], ist[S_ARRIVED], ist[S_SCORED]
    n_admitted, n_res, kv_used, heap = ist[S_N_ADMITTED], ist[S_N_RES], ist[S_KV_USED], ist[S_HEAP]
    contended, decodes, partial, released = ist[S_CONTENDED], ist[S_DECODES], ist[S_PARTIAL], ist[S_RELEASED]
    lru_head, lru_tail = ist[S_LRU_HEAD], ist[S_LRU_TAIL]
    yields, fb_n, fb_groups, fb_batch = ist[S_YIELDS], ist[S_FB_N], ist[S_FB_GROUPS], ist[S_FB_BATCH]
    now, abs_error, charge = fst[F_NOW], fst[F_ABS_ERROR], fst[F_CHARGE]
    has_pred = pred_mode != PRED_NONE
    done_steps = 0
    status = 0
    # estimates Python published since the last call move their rows within the (key, row) order;
    # many at once (an online update re-scores every resident): re-key all and re-sort (keys move
    # little, so the insertion sort is near linear)
    if keys_on != KEY_ROW and ist[S_REKEY] > REKEY_RESORT:
        _rekey_sort(ord_keys, ord_rows, n_res, keys_on, predicted, generated)
    elif keys_on != KEY_ROW:
        for j in range(ist[S_REKEY]):
            r = rekey[j]
            if finish_s[r] == finish_s[r]:
                continue
            pos = 0
            while ord_rows[pos] != r:
                pos += 1
            for i in range(pos, n_res - 1):
                ord_keys[i], ord_rows[i] = ord_keys[i + 1], ord_rows[i + 1]
            _ord_insert(ord_keys, ord_rows, n_res - 1, _key(r, keys_on, predicted, generated), r)
    ist[S_REKEY] = 0
    while finished < n and done_steps < max_steps:
        # a SimPy event fired before the step loop resumed here: earlier, or at this instant and
        # created before the step loop's last timeout (SimPy's order: time, then creation)
        if now > fst[F_NEXT_EVENT] or (now == fst[F_NEXT_EVENT] and ist[S_NEXT_YB] < yields):
            status = NEEDS_EVENT
            break
        while arrived < n and arrival[arrived] <= now:
            arrived += 1
        if n_res == 0 and partial < 0 and n_admitted >= arrived:   # idle: wait for the next arrival
            now = now + (arrival[arrived] - now)
            yields += 1
            ist[S_DONE_LAST] = 0       # nothing finishes while idle
            ist[S_N_FIRST] = 0
            continue
        if pred_mode == PRED_PYTHON and ist[S_PY_SCORED] < arrived:
            status = NEEDS_SCORES   # the predictor scores rows [scored, arrived) in Python, at `now`
            break
        # arrival-stage scores become usable now (fixed per row: written here; else by Python)
        while scored < arrived:
            if pred_mode == PRED_STATIC:
                first_predicted[scored] = predicted[scored]
                ready_s[scored] = now
            if has_pred:
                if ordered:
                    heap = _heap_push(hk, hr, heap, predicted[scored], scored)
            scored += 1
        # decode choice (policies.selection.choose_decodes)
        n_chosen, n_forced = 0, 0
        n_res0 = n_res      # residents at step start (= the size of ord_rows)
        ord_dirty = n_res   # keys changed in ord_rows[:ord_dirty] (all but the common case below)
        if n_res <= decode_slots:
            for j in range(n_res):
                chosen[j] = resident[j]
            n_chosen = n_res
        else:
            n_starving = 0
            # the least recently served resident heads the LRU list: nobody starves unless it does
            if wait_cap and step - last_served[lru_head] > wait_cap:
                for j in range(n_res):
                    if step - last_served[resident[j]] > wait_cap:
                        n_starving += 1
            if n_starving:
                n_other = 0
                for j in range(n_res):
                    r = resident[j]
                    if step - last_served[r] > wait_cap:
                        chosen[n_forced] = r
                        n_forced += 1
                    else:
                        scratch_rows[n_other] = r
                        n_other += 1
                if n_forced >= decode_slots:
                    # the longest-starved win: stable sort by last_served (insertion sort)
                    for a in range(1, n_forced):
                        r = chosen[a]
                        b = a - 1
                        while b >= 0 and last_served[chosen[b]] > last_served[r]:
                            chosen[b + 1] = chosen[b]
                            b -= 1
                        chosen[b + 1] = r
                    n_forced = decode_slots
                    n_chosen = decode_slots
                else:
                    k = decode_slots - n_forced
                    if k > n_other:
                        k = n_other
                    if keys_on == KEY_ROW:
                        for j in range(k):
                            chosen[n_forced + j] = scratch_rows[j]
                    else:   # the first k non-starving rows: locked ones (row order), then (key, row) order
                        m2 = 0
                        if lock_c >= 0.0:
                            for j in range(n_other):
                                if m2 < k and _locked(scratch_rows[j], step, lock_c, last_served, generated,
                                                      first_predicted):
                                    chosen[n_forced + m2] = scratch_rows[j]
                                    m2 += 1
                        i = 0
                        while m2 < k:
                            r = ord_rows[i]
                            i += 1
                            if not (step - last_served[r] > wait_cap) and not (
                                    lock_c >= 0.0 and _locked(r, step, lock_c, last_served, generated,
                                                              first_predicted)):
                                chosen[n_forced + m2] = r
                                m2 += 1
                    n_chosen = n_forced + k
            else:
                if keys_on == KEY_ROW:
                    for j in range(decode_slots):
                        chosen[j] = resident[j]
                elif lock_c >= 0.0:   # TRAIL: locked rows first (row order), then (key, row) order
                    m2 = 0
                    for j in range(n_res):
                        if m2 < decode_slots and _locked(resident[j], step, lock_c, last_served, generated,
                                                         first_predicted):
                            chosen[m2] = resident[j]
                            m2 += 1
                    i = 0
                    while m2 < decode_slots:
                        r = ord_rows[i]
                        i += 1
                        if not _locked(r, step, lock_c, last_served, generated, first_predicted):
                            chosen[m2] = r
                            m2 += 1
                else:   # the (key, row) order's prefix; only its keys change this step
                    for j in range(decode_slots):
                        chosen[j] = ord_rows[j]
                    ord_dirty = decode_slots
                n_chosen = decode_slots
        budget = prefill_budget - (n_chosen if decodes_in_budget else 0)
        carried = partial
        carried_chunk = 0
        if carried >= 0:   # a partly prefilled prompt continues before new admissions
            left = prompt[carried] - prefilled[carried]
            carried_chunk = left if left < (budget if budget > 0 else 0) else (budget if budget > 0 else 0)
            budget -= carried_chunk
        waiting = arrived - n_admitted
        # admission (Scheduler._admit)
        n_admit = 0
        room = max_resident - n_res - (1 if partial >= 0 else 0)
        if budget > 0 and room > 0 and n_admitted < arrived:
            tokens = 0
            nxt = 0
            while n_admit < room:
                if ordered:
                    if heap == 0:
                        break
                    r = hr[0]
                else:
                    r = n_admitted + nxt
                    if r >= arrived:
                        break
                c = tokens + prompt[r]
                last = False
                if c > budget:
                    if chunked:   # the next one gets what budget is left, as a first chunk
                        if tokens < budget:
                            last = True
                        else:
                            break
                    elif n_admit > 0:   # strict order; an over-long prompt goes alone
                        break
                if kv_budget >= 0 and c > kv_budget - kv_used and not (n_admit == 0 and n_res == 0):
                    break
                if ordered:
                    heap = _heap_pop(hk, hr, heap)
                else:
                    nxt += 1
                admit[n_admit] = r
                n_admit += 1
                tokens = c
                if last:
                    break
            for j in range(n_admit):
                admitted[admit[j]] = True
            n_admitted += n_admit
        if n_admit == 0 and n_chosen == 0 and carried_chunk == 0:
            status = STALLED
            ist[S_STALL_READY] = n_res
            ist[S_STALL_WAITING] = waiting
            break
        yields += 1
        if n_res > decode_slots or (ordered and arrived > n_admitted):
            contended += 1
        # prefill (Scheduler._prefill): rows whose prompt completes this step emit their first token
        prefill_tokens, prefill_sq, n_first = 0, 0, 0
        if not chunked:
            for j in range(n_admit):
                p = prompt[admit[j]]
                prefill_tokens += p
                prefill_sq += p * p
                firsts[j] = admit[j]
            n_first = n_admit
        else:
            before = prefilled[carried] if carried >= 0 else 0
            prefill_tokens = carried_chunk
            prefill_sq = carried_chunk * (before + carried_chunk)
            if carried >= 0:
                prefilled[carried] += carried_chunk
                if prefilled[carried] == prompt[carried]:
                    firsts[0] = carried
                    n_first = 1
                    partial = -1
            cum = 0
            chunk = 0
            for j in range(n_admit):
                r = admit[j]
                p = prompt[r]
                rest = budget - cum
                if rest < 0:
                    rest = 0
                chunk = p if p < rest else rest
                cum += p
                prefilled[r] = chunk
                prefill_tokens += chunk
                prefill_sq += chunk * chunk
                if chunk == p:
                    firsts[n_first] = r
                    n_first += 1
            if n_admit and chunk < prompt[admit[n_admit - 1]]:
                partial = admit[n_admit - 1]
            if n_admit == 0 and n_chosen == 0 and carried >= 0 and prefilled[carried] <= before:
                status = STALLED   # Scheduler.compose: a carried chunk that computed nothing
                ist[S_STALL_READY] = -1 - carried
                ist[S_STALL_WAITING] = before
                break
        context = 0
        for j in range(n_chosen):
            context += prompt[chosen[j]]
        gen_sum = 0
        for j in range(n_chosen):
            gen_sum += generated[chosen[j]]
        context += gen_sum
        if has_pred and n_chosen:   # PredictionDriver.note_decodes: error of the estimates in use
            for j in range(n_chosen):
                err[j] = abs(predicted[chosen[j]] - length[chosen[j]])
            abs_error += _pairwise(err, 0, n_chosen)
            decodes += n_chosen
        duration = _step_time(kind, pi, pf, prefill_tokens, prefill_sq, n_chosen, context)
        if gc[3] and n_admit:      # PredictionDriver.step_charge of a prefill-stage predictor
            charge += gc[0] + gc[1] * n_admit + gc[2] * prefill_tokens
        fst[F_GPU_S] += charge
        duration += charge         # the predictor's GPU debt (0.0 for a free one)
        charge = 0.0
        end = now + duration
        # land (RequestTable.land) and retire (RequestTable.retire)
        tick = int(now) if step_clock else step   # simulator.requests.clock_step
        n_done = 0
        for j in range(n_chosen):
            r = chosen[j]
            generated[r] += 1
            last_served[r] = step
            if j < n_forced:
                forced_steps[r] += 1
        kv_used += n_chosen
        for j in range(n_chosen):
            r = chosen[j]
            if generated[r] >= length[r]:
                finish_s[r] = end
                finish_step[r] = tick
                done_rows[n_done] = r
                n_done += 1
                kv_used -= prompt[r] + length[r]
        for j in range(n_admit):
            admit_s[admit[j]] = now
            admit_step[admit[j]] = tick
        kv_used += prefill_tokens
        for j in range(n_first):
            r = firsts[j]
            first_token_s[r] = end
            first_token_step[r] = tick
            generated[r] = 1
            last_served[r] = step
        kv_used += n_first
        for j in range(n_first):
            r = firsts[j]
            if length[r] <= 1:
                finish_s[r] = end
                finish_step[r] = tick
                done_rows[n_done] = r
                n_done += 1
                kv_used -= prompt[r] + length[r]
        finished += n_done
        # resident: drop the finished, merge the new (in row order)
        if n_done:
            m = 0
            for j in range(n_res):
                r = resident[j]
                if not (finish_s[r] == finish_s[r]):   # still running (nan finish time)
                    resident[m] = r
                    m += 1
            n_res = m
        if n_first:
            n_new = 0
            for j in range(n_first):
                r = firsts[j]
                if length[r] > 1:
                    # insertion sort of the new rows (few per step)
                    b = n_new - 1
                    while b >= 0 and scratch_rows[b] > r:
                        scratch_rows[b + 1] = scratch_rows[b]
                        b -= 1
                    scratch_rows[b + 1] = r
                    n_new += 1
            if n_new:
                a, b, m = n_res - 1, n_new - 1, n_res + n_new - 1
                while b >= 0:
                    if a >= 0 and resident[a] > scratch_rows[b]:
                        resident[m] = resident[a]
                        a -= 1
                    else:
                        resident[m] = scratch_rows[b]
                        b -= 1
                    m -= 1
                n_res += n_new
        # the LRU list of residents by last service: served rows to the tail, finished ones out
        for j in range(n_chosen):
            r = chosen[j]
            if finish_s[r] == finish_s[r] or r != lru_tail:
                p, q = lru_prev[r], lru_next[r]
                if p >= 0:
                    lru_next[p] = q
                else:
                    lru_head = q
                if q >= 0:
                    lru_prev[q] = p
                else:
                    lru_tail = p
                if not (finish_s[r] == finish_s[r]):
                    lru_head, lru_tail = _lru_append(r, lru_prev, lru_next, lru_head, lru_tail)
        for j in range(n_first):
            r = firsts[j]
            if not (finish_s[r] == finish_s[r]):
                lru_head, lru_tail = _lru_append(r, lru_prev, lru_next, lru_head, lru_tail)
        if keys_on != KEY_ROW:   # keep ord_rows sorted by (key, row): re-key, re-sort, drop, insert
            n_ord = n_res0
            # keys only fall, and only in the decoded prefix (all rows where the choice was not a prefix)
            _rekey_sort(ord_keys, ord_rows, ord_dirty if ord_dirty < n_ord else n_ord, keys_on, predicted, generated)
            if n_done:
                m = 0
                for i in range(n_ord):
                    r = ord_rows[i]
                    if not (finish_s[r] == finish_s[r]):
                        ord_rows[m], ord_keys[m] = r, ord_keys[i]
                        m += 1
                n_ord = m
            for j in range(n_first):
                r = firsts[j]
                if finish_s[r] == finish_s[r]:
                    continue
                _ord_insert(ord_keys, ord_rows, n_ord, _key(r, keys_on, predicted, generated), r)
                n_ord += 1
        if released < n and n_done:   # closed loop: each completion submits the next row
            fresh = n_done if n_done < n - released else n - released
            for j in range(released, released + fresh):
                arrival[j] = end
            released += fresh
        fst[F_START], fst[F_DURATION] = now, duration
        ist[S_DONE_LAST] = n_done      # an event due within this step saw the system before these finished
        ist[S_N_FIRST] = n_first
        ist[S_N_CHOSEN] = n_chosen
        now = end
        step += 1
        done_steps += 1
        fb_due = False
        if fb_batch and n_done:        # the finished rows' true lengths, grouped by step, for feedback
            for j in range(n_done):
                fb_rows[fb_n + j] = done_rows[j]
            fb_n += n_done
            fb_ends[fb_groups] = fb_n
            fb_groups += 1
            fb_due = fb_n >= fb_batch
        refresh_due = False            # decode-time refresh: a decoded row reached a multiple of k tokens
        k_refresh = ist[S_REFRESH_EVERY]
        if k_refresh:
            for j in range(n_chosen):
                r = chosen[j]
                if generated[r] % k_refresh == 0 and generated[r] < length[r]:
                    refresh_due = True
                    break
        # estimates from the prefill (hidden state, or an arrival-stage predictor's prefill observation)
        if ((pred_mode == PRED_PREFILL or ist[S_AFTER_PREFILL]) and n_first) or refresh_due or fb_due:
            status = AFTER_STEP
            break
    ist[S_STEP], ist[S_FINISHED], ist[S_ARRIVED], ist[S_SCORED] = step, finished, arrived, scored
    ist[S_N_ADMITTED], ist[S_N_RES], ist[S_KV_USED], ist[S_HEAP] = n_admitted, n_res, kv_used, heap
    ist[S_CONTENDED], ist[S_DECODES], ist[S_STATUS] = contended, decodes, status
    ist[S_PARTIAL], ist[S_RELEASED] = partial, released
    ist[S_LRU_HEAD], ist[S_LRU_TAIL] = lru_head, lru_tail
    ist[S_YIELDS], ist[S_FB_N], ist[S_FB_GROUPS] = yields, fb_n, fb_groups
    fst[F_NOW], fst[F_ABS_ERROR], fst[F_CHARGE] = now, abs_error, charge
    return done_steps


_JITTED = ("_dl_split", "_dl_mul", "_py_hypot", "_pairwise_block", "_pairwise", "_step_time", "_locked", "_before", "_key",
           "_rekey_sort", "_ord_insert", "_lru_append", "_heap_push", "_heap_pop")


def numba_cache_folder() -> str:
    """Where numba caches this kernel: ``$NUMBA_CACHE_DIR``, else leap-sched's cache, in a folder
    named by the values compiled in from other modules. numba re-validates a cached function by
    its own file's stamp only, so a changed ``REMAINING_FLOOR`` must lead to another folder."""
    from core.io import cache_dir

    key = hashlib.sha256(repr(("REMAINING_FLOOR", REMAINING_FLOOR)).encode()).hexdigest()[:12]
    base = os.environ.get("NUMBA_CACHE_DIR") or str(cache_dir() / "numba")
    return os.path.join(base, f"kernel-{key}")


@functools.lru_cache(maxsize=1)
def load_kernel():
    """The jitted step function, or None without numba. Imported on first use, so reference runs
    never pay for numba; the helpers are jitted in place (the kernel calls them by module name).
    Cached on disk by numba (:func:`numba_cache_folder`), so only the first process after a change
    compiles. The cache used to crash on reload: ``_pairwise`` was recursive, which numba cannot
    reload (numba#6061); it walks a stack now."""
    try:
        import numba
    except ImportError:
        return None
    jit = numba.njit(nogil=True, cache=True)
    module = globals()
    saved, numba.config.CACHE_DIR = numba.config.CACHE_DIR, numba_cache_folder()   # read when jitted
    try:
        for name in _JITTED:
            module[name] = jit(module[name])
        return jit(_run_steps)
    finally:
        numba.config.CACHE_DIR = saved
