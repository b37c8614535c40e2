"""The compiled step's kernel: the engine's step loop as plain Python that numba compiles.

:func:`_run_steps` advances the engine up to a number of steps over the run's arrays, in place, and
returns to Python (:mod:`simulator.compiled`) whenever a step needs it: rows to score at arrival,
Python's part of a step just landed (prefill estimates, refreshes, feedback), an event due between
steps, a stall. It replays :mod:`simulator.engine` with the same float64 arithmetic in the same
order (CPython's ``math.hypot`` and numpy's pairwise sum: :mod:`simulator.kernel_float`), so outputs
are byte-identical. A step's parts sit in :mod:`simulator.kernel_steps`, each beside its twin in
the reference (admission, prefill, decode choice, landing); the data they share is named in
:mod:`simulator.kernel_layout`.

The kernel keeps the resident set in row order and, for countdown, also in a persistent array sorted
by (key, row) (the reference's stable argsort order): a step decodes its prefix, whose keys are the
only ones that fall, so re-sorting the prefix keeps the order (no full sort per step). The residents
also sit in a list by last service, so the wait cap's starvation scan runs only when its head starves.
Waiting requests of a policy-ordered admission sit in a persistent heap keyed by (predicted, row)
(:mod:`simulator.kernel_order`). It counts the step loop's SimPy timeouts (steps and idle waits), so
an event at exactly a step's end is placed as SimPy places it (see :mod:`simulator.compiled`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import math
import multiprocessing
import os
import sys
import types
from pathlib import Path

from policies.ltr_starvation import PROMOTED_OFFSET, UNSEEN
from policies.trail_preemption import LOCKED_KEY
from simulator.kernel_float import _step_time
from simulator.kernel_layout import (
    AFTER_STEP,
    DONE_OR_CHUNK,
    KEY_ROW,
    NEEDS_EVENT,
    NEEDS_SCORES,
    PRED_PYTHON,
    REKEY_RESORT,
    STALLED,
    UNTIL,
)
from simulator.kernel_log import _record_finished, _record_step
from simulator.kernel_order import _ord_insert
from simulator.kernel_policies import _decode_key, _policy_rekey_sort
from simulator.kernel_steps import (
    _compose,
    _land,
    _note_decodes,
    _python_due,
    _reorder,
    _retire,
    _score_arrivals,
)

#: the modules whose functions numba compiles, in import order (their ``JITTED`` names)
KERNEL_MODULES = ("simulator.kernel_float", "simulator.kernel_order", "simulator.kernel_policies",
                  "simulator.kernel_rank", "simulator.kernel_prefix", "simulator.kernel_kv", "simulator.kernel_steps",
                  "simulator.kernel_log", "simulator.kernel")
#: the policies' files whose per-row functions the kernel compiles in (beside the policy's rule)
POLICY_SOURCES = ("policies.aging", "policies.ssjf_starvation", "policies.trail_preemption", "policies.ltr_starvation",
                  "simulator.kv_rule")
#: the modules of the step's parts, inlined into the loop (and kernel_policies' INLINED names)
STEP_MODULES = ("simulator.kernel_rank", "simulator.kernel_prefix", "simulator.kernel_kv", "simulator.kernel_steps", "simulator.kernel_log")


def _take_estimates(t, w, s, st):
    """Estimates Python published since the last call (CompiledRun._set_estimates) move their rows
    within the (key, row) order; many at once (an online update re-scores every resident): re-key
    all and re-sort (keys move little, so the insertion sort is near linear)."""
    if s.keys_on != KEY_ROW and st.n_rekey > REKEY_RESORT:
        _policy_rekey_sort(t, w, s, st, st.n_res)
    elif s.keys_on != KEY_ROW:
        n_res = st.n_res
        for j in range(st.n_rekey):
            r = w.rekey[j]
            if t.finish_s[r] == t.finish_s[r] or (s.kv_total > 0 and w.kv_recompute[r]):
                continue   # finished, or preempted (not resident: keyed again when its re-prefill completes)
            pos = 0
            while w.ord_rows[pos] != r:
                pos += 1
            for i in range(pos, n_res - 1):
                w.ord_keys[i], w.ord_rows[i] = w.ord_keys[i + 1], w.ord_rows[i + 1]
            _ord_insert(w.ord_keys, w.ord_rows, n_res - 1, _decode_key(r, t, w, s, st), r)
    st.n_rekey = 0


def _step_charge(s, st, b):
    """PredictionDriver.step_charge: the step's duration plus the predictor's GPU debt (0.0 for a
    free one; a prefill-stage predictor pays per admitting step)."""
    duration = _step_time(s.profile_kind, s.profile_ints, s.profile_floats, b.prefill_tokens, b.prefill_sq,
                          b.n_chosen, b.context)
    if s.charge_prefill and b.n_admit:
        st.charge += s.charge_per_call + s.charge_per_request * b.n_admit + s.charge_per_prompt_token * b.prefill_tokens
    st.gpu_s += st.charge
    duration += st.charge
    st.charge = 0.0
    return duration


def _land_step(t, w, s, st, b, n_before, start, duration):
    """The landing half of the step composed at ``start``: tokens, completions, the order, the clock."""
    end = start + duration
    tick = int(start) if s.step_clock else st.step   # simulator.requests.clock_step
    _land(t, w, s, st, b, st.step, tick, start, end)
    _retire(t, w, st, b, end)
    _record_finished(w, s, st)
    _reorder(t, w, s, st, b, n_before)
    b.start, b.duration = start, duration   # an event due within it saw the system before it landed
    st.now = end
    st.step += 1


def _run_steps(max_steps, t, w, s, state, batch):
    """Advance the engine up to ``max_steps`` steps (``simulator.engine.Simulation._step_loop``);
    returns the steps done, the reason it stopped in ``state[0].status``. A fleet's replica runs up
    to ``STATE.until`` (the fleet's next arrival): no step starts at or after it, and a step ending
    after it is composed and held (``STATE.held``), landed on the next call (docs/semantics.md "Fleets")."""
    st, b = state[0], batch[0]
    n = t.arrival.shape[0]
    done_steps = 0
    st.status = DONE_OR_CHUNK
    if st.held:
        if b.start + b.duration > st.until:
            st.status = UNTIL
            return 0
        n_before = st.held - 1
        st.held = 0
        _land_step(t, w, s, st, b, n_before, b.start, b.duration)
        done_steps += 1
        if _python_due(t, w, s, st, b):
            st.status = AFTER_STEP
            return done_steps
    _take_estimates(t, w, s, st)
    while st.finished < n and done_steps < max_steps:
        # a SimPy event fired before the step loop resumed here: earlier, or at this instant and
        # created before the step loop's last timeout (SimPy's order: time, then creation)
        if st.now > st.next_event or (st.now == st.next_event and st.next_yields_before < st.yields):
            st.status = NEEDS_EVENT
            break
        if st.now >= st.until:   # a fleet routes its arrivals at this instant first
            st.status = UNTIL
            break
        arrived = st.arrived
        while arrived < n and t.arrival[arrived] <= st.now:
            arrived += 1
        st.arrived = arrived
        if st.n_res == 0 and st.partial < 0 and st.n_admitted >= arrived and st.n_requeued == 0:   # Scheduler.idle
            # (a fleet's replica: its next row is not routed yet (inf), it waits for the fleet's next arrival)
            wake = t.arrival[arrived] if arrived < n and t.arrival[arrived] < st.until else st.until
            if wake == math.inf:   # a fleet's replica with nothing left to route to it
                st.status = UNTIL
                break
            st.now = st.now + (wake - st.now)
            st.yields += 1
            b.n_done = 0       # nothing finishes (or is released) while idle
            b.n_first = 0
            b.n_released = 0
            continue
        if s.pred_mode == PRED_PYTHON and st.py_scored < arrived:
            st.status = NEEDS_SCORES   # the predictor scores rows [py_scored, arrived) in Python, at `now`
            break
        _score_arrivals(t, w, s, st)
        n_before = st.n_res
        if not _compose(t, w, s, st, b):
            st.status = STALLED
            break
        st.yields += 1
        _note_decodes(t, w, s, st, b)
        duration = _step_charge(s, st, b)
        start = st.now
        _record_step(w, s, st, b, n_before, start, duration)
        if start + duration > st.until:   # lands after the fleet's next arrival is routed
            b.start, b.duration = start, duration
            st.held = n_before + 1
            st.status = UNTIL
            break
        _land_step(t, w, s, st, b, n_before, start, duration)
        done_steps += 1
        if _python_due(t, w, s, st, b):
            st.status = AFTER_STEP
            break
    return done_steps


JITTED = ("_take_estimates", "_step_charge", "_land_step")


#: the rule of the kernel that forms without one (FCFS's row order) run on, and the trace wrappers' kernel
DEFAULT_RULE = "policies.countdown"


def _kernel_sources(rule: str) -> bytes:
    modules = (*KERNEL_MODULES, *POLICY_SOURCES, rule, "policies.rule")
    return b"".join(Path(importlib.import_module(m).__file__ or "").read_bytes() for m in modules)


def numba_cache_folder(rule: str = DEFAULT_RULE) -> str:
    """Where numba caches the kernel of policy rule ``rule``: ``$NUMBA_CACHE_DIR``, else leap-sched's
    cache, in a folder named by the kernel's and the rule's sources and the values compiled in from
    other modules (and the policies' files it compiles functions of). numba re-validates a cached
    function by its own file's stamp only, not by the files of the functions it calls (nor a changed
    ``LOCKED_KEY``), so any change leads to another folder."""
    compiled_in = (("LOCKED_KEY", LOCKED_KEY), ("PROMOTED_OFFSET", PROMOTED_OFFSET), ("UNSEEN", UNSEEN),
                   ("rule", rule))
    from core.jit import numba_cache_base

    digest = hashlib.sha256(repr(compiled_in).encode())
    digest.update(_kernel_sources(rule))
    return os.path.join(numba_cache_base(), f"kernel-{digest.hexdigest()[:12]}")


#: Said once, on stderr, before numba compiles the kernel (a silent half-minute looked like a hang).
COMPILE_NOTE = "note: compiling the simulator kernel once (numba, about 30 CPU-s); then cached"


def kernel_cached() -> bool:
    """Whether numba's cache already holds the kernel's step loop for these sources."""
    return any(Path(numba_cache_folder()).rglob("kernel._run_steps-*.nbi"))


@functools.cache
def announce_compile() -> None:
    """Say :data:`COMPILE_NOTE` once per command, to a terminal (as the progress bar: logs and
    pipes stay as they were), from its main process only (``simulate`` says it before starting
    sweep workers), and only when numba is there and its cache lacks the kernel."""
    if not sys.stderr.isatty() or multiprocessing.parent_process() is not None or kernel_cached():
        return
    try:
        import numba  # noqa: F401
    except ImportError:
        return
    print(COMPILE_NOTE, file=sys.stderr, flush=True)


@functools.cache
def load_kernel(rule: str = DEFAULT_RULE):
    """The jitted step function with policy rule ``rule`` (a module of ``policies/rule.py``'s form)
    compiled in, or None without numba. Imported on first use, so reference runs never pay for
    numba. The default rule's kernel is jitted in place in every kernel module that calls its
    helpers by name; another rule's kernel shares the helpers that never reach the rule
    (:func:`rule_free`: compiled once, for every rule) and is made of copies of the rest, each
    module's globals a private copy in which those helpers and the rule are that kernel's (numba
    reads them when it compiles), so kernels of several rules live in one process. Cached on disk by numba
    (:func:`numba_cache_folder`, one folder per rule), so only the first process after a change
    compiles. The cache used to crash on reload: ``_pairwise`` was recursive, which numba cannot
    reload (numba#6061); it walks a stack now. Compiled without numba's reference counts
    (``_nrt=False``; the kernel allocates nothing): each read of an array from the named tuples
    would otherwise count a reference, which made the cut kernel 2x slower than the one-function one.
    The step's parts (:mod:`simulator.kernel_steps`, :mod:`simulator.kernel_policies`) are inlined
    into the loop by LLVM (``forceinline``): called, each passes the named tuples' arrays as hundreds of
    scalar arguments (up to 1.2x slower); numba's own inlining (``inline="always"``) ran as fast but
    copied each part's IR at every call site, a quarter of every kernel's compile."""
    try:
        import numba
    except ImportError:
        return None
    from policies.rule import compile_rules

    compile_rules(rule)   # the rule's functions compiled in place (its own cache)
    in_place = rule == DEFAULT_RULE
    if not in_place:
        load_kernel(DEFAULT_RULE)   # the shared functions jitted in place (dispatchers: nothing compiles here)
    rule_module = importlib.import_module(rule)
    bindings = {name: getattr(rule_module, function) for name, function in RULE_BINDINGS.items()}
    modules = [importlib.import_module(m) for m in KERNEL_MODULES]
    shared = rule_free(modules)
    spaces = {m.__name__: vars(m) if in_place else dict(vars(m)) for m in modules}
    jit = numba.njit(nogil=True, cache=True, _nrt=False)
    inline = numba.njit(nogil=True, cache=True, _nrt=False, forceinline=True)
    folder = numba_cache_folder(rule)
    tag = os.path.basename(folder).replace("-", "_")   # this kernel's names (_own)
    saved, numba.config.CACHE_DIR = numba.config.CACHE_DIR, folder   # read when jitted
    try:
        steps = ({name for m in STEP_MODULES for name in importlib.import_module(m).JITTED}
                 | set(importlib.import_module("simulator.kernel_policies").INLINED) | set(JITTED))
        jitted = {}
        for m in modules:
            for name in m.JITTED:
                if in_place or name not in shared:
                    jitted[name] = (inline if name in steps else jit)(_own(vars(m)[name], spaces, in_place, tag))
        for space in spaces.values():
            for name, fn in (*jitted.items(), *bindings.items()):
                if name in space:
                    space[name] = fn
        return jit(_own(_run_steps, spaces, in_place, tag))
    finally:
        numba.config.CACHE_DIR = saved


#: the names through which the kernel calls the policy's rule, each bound by :func:`load_kernel` to the
#: rule module's function of the given name
RULE_BINDINGS = {"_rule_decode_key": "decode_key", "_rule_admission_key": "admission_key"}


def rule_free(modules) -> frozenset[str]:
    """The kernel functions (``JITTED`` names of ``modules``) whose calls never reach the policy's rule:
    every rule's kernel shares them (the default kernel's, compiled once), and compiles its own copy of
    the rest. Read from the code's names, so a new helper is placed without a list to keep."""
    calls = {}
    for m in modules:
        for name in m.JITTED:
            fn = getattr(vars(m)[name], "py_func", vars(m)[name])
            calls[name] = _names(fn.__code__)
    reaches = set(RULE_BINDINGS)
    grew = True
    while grew:
        grew = False
        for name, called in calls.items():
            if name not in reaches and called & reaches:
                reaches.add(name)
                grew = True
    return frozenset(calls.keys() - reaches)


def _names(code: types.CodeType) -> set[str]:
    """The global and attribute names ``code`` and the code nested in it read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def first_call(fn, rule: str, *args):
    """``fn(*args)`` for a kernel (or a wrapper around it) of policy rule ``rule``; its first call in a
    process, where numba compiles it or loads it from the cache, holds the lock of the rule's cache
    folder (:func:`core.jit.compile_lock`), so that a sweep's workers starting together on an empty
    cache compile it once: the first compiles, the others wait and then load it."""
    if id(fn) in _CALLED:   # asking numba (``signatures``) costs more than a short call's run
        return fn(*args)
    if getattr(fn, "signatures", True):   # compiled in this process already (or plain Python)
        _CALLED[id(fn)] = fn
        return fn(*args)
    from core.jit import compile_lock

    with compile_lock(numba_cache_folder(rule)):
        done = fn(*args)
    _CALLED[id(fn)] = fn
    return done


#: the kernels :func:`first_call` has called in this process, by id (each held, so no id is reused)
_CALLED: dict[int, object] = {}


def _own(fn, spaces: dict, in_place: bool, tag: str):
    """``fn`` (its plain Python) as the kernel ``tag`` compiles it: itself when jitted in place (the
    default rule's kernel); else a copy reading its globals from its kernel module's ``spaces`` entry
    (a policy's own function: its own globals) and named after the kernel (``name_kernel_<digest>``).

    The name matters: numba names a compiled function by module, qualified name, a per-process
    counter and argument types, and links a function a kernel calls into it as a weak symbol. Two
    rules' kernels compiled in two processes whose counters ran alike held helpers of one name with
    different bodies (``kernel_order._rekey_sort``, each rule's key inlined); loaded from the disk
    cache into one process, a kernel's call can bind to the helper of the kernel loaded first (weak
    symbols resolve to the first definition). Named per kernel, no two kernels share a name."""
    fn = getattr(fn, "py_func", fn)
    if in_place:
        return fn
    own = types.FunctionType(fn.__code__, spaces.get(fn.__module__, fn.__globals__), fn.__name__, fn.__defaults__,
                             fn.__closure__)
    own.__qualname__ = f"{fn.__qualname__}_{tag}"
    return own
