"""A policy's keys written once, as a rule: plain per-row functions that both engines call.

A policy whose keys depend only on a request's own state (its estimate, tokens generated, arrival,
first estimate, attributes) writes them as two functions in its own file::

    def decode_key(r, t, rank): ...       # row r's key for a decode slot (lower first)
    def admission_key(r, t, rank): ...    # ... for admission (asked with an arrival-stage predictor)
    RULES = ("decode_key", "admission_key")

``t`` holds the rows' arrays by name (``predicted``, ``generated``, ``arrival``,
``first_predicted``, ``attributes``, the :data:`core.attributes.Attributes` tuple, ``prompt``,
the prompt tokens, and ``cached``, those found cached: ``SchedulerView.cached``, 0 in the compiled
kernel, which models no cache) and ``t.params``, the policy's own numbers (:meth:`RulePolicy.params`, float64,
the same array in both engines, so a setting is data, not compiled in); ``rank``
says the estimates are a rank predictor's scores. The policy's class derives from
:class:`RulePolicy` and names the module (``rule = __name__``): its keys are the rule's, and its
compiled form names the module (``CompiledForm(keys="rule", rule=...)``): the compiled kernel compiles the same functions in (``simulator.kernel``), so
both engines make the same keys bit for bit. The functions are plain loops and arithmetic (numba
compiles them as written, without reference counts); a rule may call another rule module's
functions through that module (``countdown.decode_key(r, t, rank)``). Keys must not depend on the
clock or the step: the kernel keeps its order across steps and re-keys a row only when its state
changes (a policy whose keys age declares it on its ``CompiledForm``). Keys that rise when a row
decodes (a queue level, a deadline) declare ``keys_rise``: the kernel then re-sorts every resident
after each step instead of only the decoded prefix.
"""

from __future__ import annotations

import importlib
import types
from collections import namedtuple
from typing import Any, ClassVar

import numpy as np

from core.attributes import defaults
from core.jit import cached_per_numba
from policies.base import CompiledForm, Policy, SchedulerView

#: the rows' arrays a rule reads (the compiled kernel's ``Rows`` has the same names)
RuleRows = namedtuple("RuleRows", "predicted generated arrival first_predicted attributes prompt params cached",
                      defaults=(None, None, None))
#: a rule without numbers of its own still reads a float64 array (numba types it once)
NO_PARAMS = np.zeros(1, dtype=np.float64)


def params_array(params) -> np.ndarray:
    """A rule's numbers as the rule reads them (``t.params``): float64, never empty."""
    return np.asarray(params, dtype=np.float64) if len(params) else NO_PARAMS


def rows_of(view, params=()) -> RuleRows:
    """A :class:`policies.base.SchedulerView`'s arrays as a rule reads them (``params``: the policy's numbers)."""
    n = len(view.predicted)
    first = view.first_predicted if view.first_predicted is not None else np.full(n, np.nan)
    attrs = view.attributes if view.attributes is not None else defaults(n)
    prompt = view.prompt if view.prompt is not None else np.zeros(n, dtype=np.int64)
    cached = view.cached if view.cached is not None else np.zeros(n, dtype=np.int64)
    return RuleRows(view.predicted, view.generated, view.arrival_s, first, attrs, prompt, params_array(params), cached)


def keys(module: str, which: str, view, rows: np.ndarray, params=()) -> np.ndarray:
    """The keys of ``rows`` by rule ``module``'s ``which`` function (``decode_key``/``admission_key``)."""
    fill = load(module)[which]
    out = np.empty(len(rows), dtype=np.float64)
    fill(np.ascontiguousarray(rows, dtype=np.int64), out, rows_of(view, params), view.output_kind == "rank")
    return out


class RulePolicy(Policy):
    """A policy whose keys are its rule module's (``rule``: the module's name, e.g. ``__name__``)."""

    rule: ClassVar[str]
    compiled: ClassVar[bool] = True   # its rule compiles into the kernel (compiled_form)
    keys_rise: ClassVar[bool] = False  # a decode can raise a row's key (CompiledForm.keys_rise)

    def params(self) -> tuple[float, ...]:
        """The rule's numbers (``t.params``), e.g. its settings; none by default."""
        return ()

    def decode_keys(self, view: SchedulerView, rows: np.ndarray) -> np.ndarray:
        return keys(self.rule, "decode_key", view, rows, self.params())

    def admission_keys(self, view: SchedulerView, rows: np.ndarray) -> np.ndarray:
        return keys(self.rule, "admission_key", view, rows, self.params())

    def compiled_form(self) -> CompiledForm:
        return CompiledForm(keys="rule", rule=self.rule, params=self.params(), keys_rise=self.keys_rise)


rule: Any = None   # the rule function each copy of _fill calls: bound in the copy's own globals (load)


def _fill(rows, out, t, rank):
    """``out[j]`` = the rule's key of ``rows[j]`` (``rule`` is bound per rule module)."""
    for j in range(rows.shape[0]):
        out[j] = rule(rows[j], t, rank)


#: the functions of a policy's keys, each run over rows by a loop of :func:`_fill`'s
KEY_FUNCTIONS = ("decode_key", "admission_key")


@cached_per_numba
def compile_rules(module: str) -> bool:
    """numba-compile rule ``module``'s ``RULES`` in place (those of the rule modules it calls first):
    True; False without numba, when the plain Python runs (the same operations, so the same bits)."""
    from core.jit import compile_in_place

    mod = importlib.import_module(module)
    for called in vars(mod).values():
        if isinstance(called, types.ModuleType) and called is not mod and hasattr(called, "RULES"):
            compile_rules(called.__name__)
    return compile_in_place(vars(mod), mod.RULES, mod.__file__ or "")


@cached_per_numba
def load(module: str) -> dict:
    """Rule ``module``'s loops over rows, by function name (its rules compiled in place first, and
    the loops too, one per function, with numba)."""
    from core.jit import numba_cache_base

    compiled = compile_rules(module)   # NOTE(live): plain Python until a kernel loads numba (core.jit)
    space = vars(importlib.import_module(module))
    loops = {}
    for name in KEY_FUNCTIONS:
        loop = types.FunctionType(_fill.__code__, {"__name__": __name__, "rule": space[name], "range": range}, "_fill")
        loops[name] = _jit_loop(loop, module, name, numba_cache_base()) if compiled else loop
    return loops


def _jit_loop(loop, module: str, name: str, base: str):
    import hashlib
    import os
    from pathlib import Path

    import numba

    source = Path(importlib.import_module(module).__file__ or "").read_bytes() + Path(__file__).read_bytes()
    folder = f"rule-loop-{module}-{name}-{hashlib.sha256(source).hexdigest()[:12]}"
    saved, numba.config.CACHE_DIR = numba.config.CACHE_DIR, os.path.join(base, folder)
    try:
        return numba.njit(nogil=True, cache=True)(loop)
    finally:
        numba.config.CACHE_DIR = saved
