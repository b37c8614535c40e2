"""Which predictors run inside a live vLLM engine (``live/``, ``leap-serve``, ``vllm serve``), declared
once: the live scheduler builds them, ``live.config`` checks settings against them, and
``leap-validate`` replays a live run with each one's simulator twin.

Each live predictor names its twin (the simulator predictor it reproduces, by the name ``simulate``
knows it by) and whether it reads the serving model's hidden state through the worker hook; its
stage (``arrival``: it may order admission; ``prefill``: no estimate before prefill) is its twin's,
so the live scheduler and the simulator cannot disagree on it. Every simulator predictor is either
some live predictor's twin or in :data:`NOT_LIVE` with the reason (tests/test_live_registry.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from predictors import NO_PREDICTOR, PREDICTORS


@dataclass(frozen=True)
class LiveForm:
    """One live predictor: its simulator twin and whether it needs the worker hook."""

    twin: str
    needs_hook: bool

    @property
    def stage(self) -> str | None:
        """When its estimate exists (the twin's stage); None without a predictor."""
        return None if self.twin == NO_PREDICTOR else PREDICTORS[self.twin].stage


#: live predictor name -> its form (the live classes in ``live/predictors.py``, one per name)
LIVE_PREDICTORS: dict[str, LiveForm] = {
    NO_PREDICTOR: LiveForm(twin=NO_PREDICTOR, needs_hook=False),
    "oracle": LiveForm(twin="oracle", needs_hook=False),
    "ssjf": LiveForm(twin="ssjf", needs_hook=False),
    "leap": LiveForm(twin="leap", needs_hook=True),
    "leap-rls": LiveForm(twin="leap-rls", needs_hook=True),
}
#: Simulator predictors that cannot run live here, and why (named in the refusal).
NOT_LIVE = {
    "egtp": "entropy-pooled prompt states over the full vocabulary",
    "trail": "decode-time layer-10 states and a text-encoder prior",
    "tie": "a text-encoder embedding scored by quadrature (the live text-encoder baseline is ssjf)",
    "ltr": "a text-encoder embedding ranked by score (the live text-encoder baseline is ssjf)",
    "noisy-oracle": "a noise source (only the exact oracle runs live)",
}
#: Live predictors that score a request at arrival (before prefill): they may order admission.
ARRIVAL_PREDICTORS = tuple(name for name, form in LIVE_PREDICTORS.items() if form.stage == "arrival")
