"""Which predictors run inside a live vLLM engine (``live/``, ``leap-serve``, ``vllm serve``), derived
from what each predictor class declares (``Predictor.live``, ``live_hook``, ``live_prompt_text``):
the live scheduler builds them, ``live.config`` checks settings against them, and ``leap-validate``
replays a live run with each one's simulator twin.

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
    """One live predictor: its simulator twin and what the twin's class declares of its live form
    (``Predictor.live_hook``, ``live_prompt_text``)."""

    twin: str
    needs_hook: bool
    prompt_text: bool = False   # it scores the raw prompt text: the request carries it, head weights needed

    @property
    def twin_class(self):
        """The simulator class it reproduces; None without a predictor."""
        return None if self.twin == NO_PREDICTOR else PREDICTORS[self.twin]

    @property
    def has_predictor(self) -> bool:
        return self.twin_class is not None

    @property
    def stage(self) -> str | None:
        """When its estimate exists (the twin's stage); None without a predictor."""
        cls = self.twin_class
        return None if cls is None else cls.stage

    @property
    def learns_online(self) -> bool:
        """It learns from finished requests (the hook keeps each request's vectors for it)."""
        cls = self.twin_class
        return cls is not None and cls.learns_online

    @property
    def router_estimate(self) -> str | None:
        """What a live fleet's least-work reads before the replica's estimate (``Predictor.live_router_estimate``)."""
        cls = self.twin_class
        return None if cls is None else cls.live_router_estimate()


#: live predictor name -> its form (the live classes in ``live/predictors.py``, one per name): no
#: predictor, and every registered predictor whose class declares ``live``
LIVE_PREDICTORS: dict[str, LiveForm] = {
    NO_PREDICTOR: LiveForm(twin=NO_PREDICTOR, needs_hook=False),
    **{name: LiveForm(twin=name, needs_hook=cls.live_hook, prompt_text=cls.live_prompt_text)
       for name, cls in PREDICTORS.items() if cls.live},
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
