"""The policy interface: how resident requests compete for decode slots (and, optionally, admission).

A policy turns the scheduler's view of some requests into sort keys; lower keys are served first.
The engine breaks ties by row order, and rows are numbered in (arrival time, request id) order, so
every ordering is total and runs replay byte for byte. Returning ``None`` means "row order" (FCFS),
which lets the engine skip sorting altogether.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from core.attributes import Attributes


@dataclass
class SchedulerView:
    """Read-only request state the policy may use. Arrays are indexed by row; never the true length."""

    now: float
    arrival_s: np.ndarray      # float64, scheduled arrival
    predicted: np.ndarray      # float64, current estimate of total length (or rank score)
    generated: np.ndarray      # int64, output tokens emitted so far
    output_kind: str           # "length" or "rank"
    step: int = 0              # index of the step being composed
    last_served: np.ndarray | None = None      # int64, step of each row's last decode (or prefill)
    first_predicted: np.ndarray | None = None  # float64, each row's first estimate (nan before)
    attributes: Attributes | None = None       # each row's request attributes (core.attributes; None: defaults)
    prompt: np.ndarray | None = None           # int64, each row's prompt tokens (None: unknown, read as 0)
    # int64, each row's prompt tokens found cached (prefix caching; None: no cache, read as 0): an
    # admitted row's hit at its first admission (vLLM's num_cached_tokens), a waiting row's lookup
    # when admission was last ordered (only for a policy that declares ``reads_cached``)
    cached: np.ndarray | None = None


@dataclass(frozen=True)
class CompiledForm:
    """What the compiled kernel (``simulator/kernel.py``) runs in place of ``decode_keys``: a policy
    that declares one is replayed there byte for byte; one that does not runs on the reference engine.

    ``keys``: ``"row"`` (arrival order) or ``"rule"``: the keys of the rule module named by ``rule``
    (``policies/rule.py``: the policy's own functions, compiled into the kernel; countdown's
    ``"policies.countdown"`` for the policies that start from its remaining length); ``lock_after``: TRAIL's limited preemption, a row past this share of its
    first estimate that held a slot in the previous step keeps it; ``rank_predictors``: whether a
    rank-only predictor's scores may serve as keys under this form; ``starve_after_s``: SSJF's
    starvation override, a decision whose longest-waiting row (the first by arrival) has waited more
    than this, or more than ``starve_factor`` x its predicted execution time (``exec_base_s`` +
    ``exec_per_token_s`` x its estimate, floored at 0), orders its rows by arrival instead;
    ``aging_log_rate``: TIE's aging, each key (the ``keys`` score, and the estimate for admission)
    becomes round(log(score) + this x wait, 9 decimals), the wait counted on a clock floored to
    ``aging_every_s`` (``policies.aging``); ``promote_after_idle``: LTR's starvation rule, a row not
    run for this many steps is put first for ``promoted_runs`` runs (``policies.ltr_starvation``:
    the kernel keeps that policy's own per-row state arrays); ``params``: the rule's numbers, read
    by the rule as ``t.params`` in both engines; ``keys_rise``: a decode may raise a row's key (a
    queue level, a deadline), so the kernel re-sorts every resident after each step.
    """

    keys: Literal["row", "rule"]
    rule: str | None = None
    lock_after: float | None = None
    rank_predictors: bool = True
    starve_after_s: float | None = None
    starve_factor: float = 0.0
    exec_base_s: float = 0.0
    exec_per_token_s: float = 0.0
    aging_log_rate: float | None = None
    aging_every_s: float = 0.0
    promote_after_idle: int | None = None
    promoted_runs: int = 0
    params: tuple[float, ...] = ()   # the rule's numbers (``t.params``, policies/rule.py)
    keys_rise: bool = False          # a decode may raise a key: re-sort every resident after a step


class Policy(ABC):
    """One scheduling policy. Subclasses live one per file and register in ``policies/__init__``."""

    name: ClassVar[str]
    uses_predictions: ClassVar[bool] = True
    # where it runs (tests/test_capabilities.py holds every registered class to these), each one
    # declared False with its reason in ``why_not`` (the fallback note or the live refusal names it)
    capabilities: ClassVar[tuple[str, ...]] = ("compiled", "live")
    compiled: ClassVar[bool] = False   # compiled_form() states it for the compiled kernel
    # the live scheduler (live/scheduler.py) runs it: it needs only the SchedulerView fields vLLM can fill
    live: ClassVar[bool] = False
    why_not: ClassVar[dict[str, str]] = {}

    # settings a run may give (``--setting NAME.KEY=VALUE``; policies/settings.py types and checks
    # them): name -> default; the class's ``__init__`` takes them as keyword arguments
    settings_defaults: ClassVar[dict[str, int | float]] = {}
    needs_slo: ClassVar[bool] = False   # built from the run's SLOs (``--slo``): __init__ takes ``slos``
    # its admission keys read waiting rows' ``SchedulerView.cached`` (the scheduler then looks them up)
    reads_cached: bool = False
    # the compiled kernel preempts in the decode order (policies.selection.victim_order's default);
    # a class that declares its own ``victim_keys`` is declared False here when it is defined
    kernel_victims: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "victim_keys" in cls.__dict__ and "kernel_victims" not in cls.__dict__:
            cls.kernel_victims = False

    def reset(self, n: int) -> None:  # noqa: B027 -- optional hook: stateless policies keep the no-op
        """A new run of ``n`` rows starts: drop any state kept from the previous one (stateful
        policies, e.g. starvation counters). Stateless policies need nothing."""

    @abstractmethod
    def decode_keys(self, view: SchedulerView, rows: np.ndarray) -> np.ndarray | None:
        """Keys for resident ``rows`` competing for decode slots; None = row order."""

    def admission_keys(self, view: SchedulerView, rows: np.ndarray) -> np.ndarray | None:
        """Keys for waiting ``rows`` (only asked when the predictor scores before prefill)."""
        return None

    def victim_keys(self, view: SchedulerView, rows: np.ndarray) -> np.ndarray | None:
        """The KV victim rule (``--kv-blocks``; docs/extending.md "Add a KV victim rule"): keys for the
        resident ``rows`` in the order a block shortage spares them, the highest key preempted first
        (:func:`policies.selection.victim_order`; the step's decodes stay ahead of the residents not
        decoding either way). None (the default): the decode order of :meth:`decode_keys`."""
        return None

    def compiled_form(self) -> CompiledForm | None:
        """The kernel's statement of this policy (None: the reference engine runs it)."""
        return None

    def describe(self) -> dict:
        return {"name": self.name, **{k: getattr(self, k) for k in self.settings_defaults}}
