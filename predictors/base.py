"""The predictor interface: what the simulator asks of a length predictor.

A predictor is bound to one run's workload (a trace whose rows are the run's requests, in arrival
order) and answers for *rows* of that workload. Lengths are in output tokens; a rank predictor
(``output = "rank"``) returns a score where lower means "serve first" instead.

Timing is the engine's business, but the predictor declares what it needs:
- ``stage = "arrival"``: it scores from the prompt alone (text encoders), so it may order admission;
- ``stage = "prefill"``: it needs the serving model's hidden state, so its estimate exists only
  once the request's prefill reaches the tapped layer;
- ``refresh_every``: re-estimate every k generated tokens during decode (TRAIL);
- :meth:`feedback`: the true length of each finished request, for online learning; the returned
  :class:`PendingUpdate` runs on a separate CPU worker and is published only when it completes;
- :class:`PredictorCost`: GPU seconds charged to engine steps and CPU seconds that delay readiness.
  Costs are model figures (deterministic), not wall-clock measurements, so runs replay exactly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

from core.hardware import DEFAULT_HARDWARE, Hardware
from core.trace import Trace


@dataclass(frozen=True)
class PredictorCost:
    """Deterministic cost figures of one predictor on the serving system."""

    gpu_s_per_call: float = 0.0          # launch overhead of one batched call on the serving GPU
    gpu_s_per_request: float = 0.0       # per request scored on the GPU
    gpu_s_per_prompt_token: float = 0.0  # per prompt token encoded on the GPU
    gpu_s_per_refresh: float = 0.0       # per request re-estimated during decode
    cpu_s_per_prediction: float = 0.0    # CPU time before an estimate is ready (async, off the GPU)
    tap_fraction: float = 1.0            # share of a prefill step done when the tapped layer is reached

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"PredictorCost.{name} must be finite and >= 0, got {value}")
        if self.tap_fraction > 1:
            raise ValueError("PredictorCost.tap_fraction must be in [0, 1]")

    def gpu_s(self, requests: int, prompt_tokens: int) -> float:
        """GPU seconds to score ``requests`` prompts with ``prompt_tokens`` tokens in one call."""
        if requests == 0:
            return 0.0
        return (self.gpu_s_per_call + self.gpu_s_per_request * requests
                + self.gpu_s_per_prompt_token * prompt_tokens)

    @property
    def charges_gpu(self) -> bool:
        return (self.gpu_s_per_call + self.gpu_s_per_request + self.gpu_s_per_prompt_token
                + self.gpu_s_per_refresh) > 0


FREE = PredictorCost()


@dataclass(frozen=True)
class Known:
    """What the serving system knows when it asks for estimates: requests arrived and finished so
    far (queue-aware predictors, e.g. TIE's L_q). The engine passes it with every ``predict``."""

    arrived: int
    finished: int


@dataclass
class PendingUpdate:
    """Online-learning work handed to the CPU worker; ``publish`` makes its result visible."""

    cpu_s: float
    publish: Callable[[], None]
    requests: int = 0


@dataclass(frozen=True)
class PredictorOptions:
    """Everything a predictor may be built from; the CLI maps its flags onto this."""

    train_trace: str | None = "lmsys"
    noise_mae: float = 0.0
    seed: int = 0
    refresh: bool | None = None          # decode-time refresh where the method supports it
    update_every: int = 8                # online feedback batch (LEAP+RLS)
    # per-predictor settings, {predictor name: {setting: value}}; each predictor declares its own
    # (``Predictor.settings_defaults``, typed by their defaults) and refuses unknown ones
    settings: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not np.isfinite(self.noise_mae) or self.noise_mae < 0:
            raise ValueError(f"noise MAE must be a finite number >= 0, got {self.noise_mae}")
        if self.update_every < 1:
            raise ValueError(f"update batch must be >= 1, got {self.update_every}")
        if not isinstance(self.settings, dict) or not all(isinstance(v, dict) for v in self.settings.values()):
            raise ValueError("predictor settings must map a predictor name to {setting: value}")


#: The allowed range of each numeric setting, by its name (the same name means the same thing in
#: every predictor): (lowest, highest, lowest itself allowed). A value outside is refused with
#: the range, before anything is trained or run.
SETTING_RANGES: dict[str, tuple[float | None, float | None, bool]] = {
    "alpha": (0.0, None, False), "lr": (0.0, None, False), "weight_decay": (0.0, None, True),
    "val_frac": (0.0, 0.9, False), "nu": (1.0, None, False), "ce_weight": (0.0, 1.0, True),
    "q_low": (0.0, 100.0, True), "q_high": (0.0, 100.0, True), "seed": (0, 2**63 - 1, True),
    **{name: (1, None, True) for name in ("epochs", "patience", "batch", "hidden", "list_size", "bucket", "bins",
                                          "queue_batch", "probe_hidden")},
    **{name: (0, None, True) for name in ("prior_hidden", "bin_max")},
}


def check_setting_range(predictor: str, key: str, value) -> None:
    """Refuse a numeric setting outside :data:`SETTING_RANGES` (NaN and infinity never get here)."""
    if key not in SETTING_RANGES or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    low, high, low_allowed = SETTING_RANGES[key]
    too_low = low is not None and (value < low or (value == low and not low_allowed))
    if too_low or (high is not None and value > high):
        bounds = (f"{'>=' if low_allowed else '>'} {low:g}" if low is not None else "") + \
                 (f"{' and ' if low is not None else ''}<= {high:g}" if high is not None else "")
        raise ValueError(f"--setting {predictor}.{key}={value!r}: must be {bounds}")


def coerce_setting(predictor: str, key: str, default, value):
    """``value`` as the type of ``default`` (strings from the command line or JSON parsed); a
    default of None takes a number or None."""
    where = f"--setting {predictor}.{key}={value!r}"
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "1", "yes", "on"):
            return True
        if str(value).lower() in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"{where}: expected true or false")
    if value is None or (isinstance(value, str) and value.lower() == "none"):
        if default is None:
            return None
        raise ValueError(f"{where}: expected a value of type {type(default).__name__}")
    kind = float if default is None else type(default)
    if kind in (int, float):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected a number") from None
        if not np.isfinite(number) or (kind is int and number != int(number)):
            raise ValueError(f"{where}: expected {'an integer' if kind is int else 'a finite number'}")
        return kind(number)
    if kind is str:
        return str(value)
    raise ValueError(f"{where}: setting {key!r} cannot be set from the command line")


class Predictor(ABC):
    """One length predictor. Subclasses live one per file and register in ``predictors/__init__``."""

    name: ClassVar[str]
    output: ClassVar[Literal["length", "rank"]] = "length"
    stage: ClassVar[Literal["arrival", "prefill"]] = "prefill"
    requires: tuple[str, ...] = ()   # trace columns the predictor reads (a head may set its own)
    sees_true_lengths: ClassVar[bool] = False  # oracles only: bound to the trace with its true lengths
    # fitted on a training trace (the report's tables compare these); a toy or rule-based predictor
    # stays out of them unless it says so
    learned: ClassVar[bool] = False
    # every row's estimate is fixed once bound (no dependence on time, queue or feedback), so the
    # compiled kernel may hold them as a constant array
    static_estimates: ClassVar[bool] = False
    queue_aware: ClassVar[bool] = False        # its estimates depend on ``Known`` (arrived, finished)
    refresh_every: int | None = None
    # feedback returns None until this many finished rows have reached it since its last update, so
    # an engine may hold the calls back until then (the compiled kernel does; 1: any call may update)
    feedback_batch: int = 1
    # what it does, declared (the compiled kernel reads these, not which methods a class overrides):
    learns_online: ClassVar[bool] = False      # feedback() returns online updates
    observes_prefill: ClassVar[bool] = False   # after_prefill() returns new estimates (an arrival-stage one)
    # where it runs (tests/test_capabilities.py holds every registered class to these), each one
    # declared False with its reason in ``why_not`` (the fallback note or the refusal names it);
    # live or not: by name in ``predictors/live.py``, beside its live twin
    capabilities: ClassVar[tuple[str, ...]] = ("compiled", "scores_at_arrival", "serves_router")
    compiled: ClassVar[bool] = True            # the compiled kernel replays it byte for byte
    # a length estimate from the prompt alone when a request arrives, before any engine holds it and
    # whatever an engine's queue holds, so a router may use it
    scores_at_arrival: ClassVar[bool] = False
    # a fleet's least-work router may add up its estimates (token counts): before the replica's own
    # estimate exists it reads the prompt-only one (``scores_at_arrival``) or ``prior_length``
    serves_router: ClassVar[bool] = True
    why_not: ClassVar[dict[str, str]] = {}
    # live (``leap-serve``, ``vllm serve``; ``predictors/live.py`` derives its registry from these): it
    # runs inside a vLLM engine (its live class in ``live/predictors.py``); ``live_hook``: it reads the
    # serving model's hidden state through the worker hook; ``live_prompt_text``: it scores the raw
    # prompt text (a text encoder and head weights) when the request arrives
    live: ClassVar[bool] = False
    live_hook: ClassVar[bool] = False
    live_prompt_text: ClassVar[bool] = False

    @classmethod
    def live_router_estimate(cls) -> Literal["length", "prior"] | None:
        """What a live fleet's least-work reads before the replica's own estimate exists: "length" =
        the request's (forced) length, an oracle's prompt-only estimate; "prior" = the prior; None =
        its prompt-only estimate is made by the engine that schedules the request, after the routing."""
        kind = cls.router_estimate()
        if kind == "prior":
            return "prior"
        return "length" if kind == "prompt" and cls.sees_true_lengths else None

    @classmethod
    def router_estimate(cls) -> Literal["prompt", "prior"] | None:
        """What least-work reads before the replica's own estimate (docs/semantics.md "Fleets"):
        "prompt" = ``predict`` at arrival, from the prompt alone; "prior" = ``prior_length`` (a
        hidden-state predictor has nothing before prefill); None = it cannot serve the router."""
        if not cls.serves_router:
            return None
        return "prompt" if cls.scores_at_arrival else "prior"

    settings_defaults: ClassVar[dict] = {}     # this predictor's own settings and their defaults (typed)

    @classmethod
    def settings(cls, options: PredictorOptions) -> dict:
        """This predictor's settings: its defaults overridden by ``options.settings[name]``, typed;
        an unknown setting is refused, naming the known ones."""
        given = options.settings.get(cls.name, {})
        out = dict(cls.settings_defaults)
        for key, value in given.items():
            if key not in out:
                known = ", ".join(cls.settings_defaults) or "none"
                raise ValueError(f"predictor {cls.name!r} has no setting {key!r} (its settings: {known})")
            out[key] = coerce_setting(cls.name, key, cls.settings_defaults[key], value)
            check_setting_range(cls.name, key, out[key])
        return out

    @classmethod
    def from_options(cls, options: PredictorOptions) -> Predictor:
        cls.settings(options)   # refuses settings this predictor does not have
        return cls()

    def bind(self, workload: Trace, rng: np.random.Generator) -> None:
        """Attach the run's requests (row i = request i of the run). Called once per run, by the
        engine, with the true output lengths removed unless ``sees_true_lengths`` (oracles)."""
        missing = [c for c in self.requires if not workload.has_feature(c)]
        if missing:
            from core.trace import TraceError
            raise TraceError(f"predictor {self.name!r} needs trace column(s) {', '.join(missing)}, "
                             f"which trace {workload.name!r} does not have")
        self.workload = workload

    def bind_beside(self, bound: Predictor, workload: Trace, rng: np.random.Generator) -> None:
        """``bind`` as ``bound`` (made by the same factory, already bound to ``workload``) was, sharing
        what it holds read-only per row, so a fleet holds it once, not once per replica; the
        default binds on its own (nothing to share)."""
        self.bind(workload, rng)

    @abstractmethod
    def predict(self, rows: np.ndarray, known: Known | None = None) -> np.ndarray:
        """Estimates for ``rows`` from the currently published state (float64 array). ``known``:
        the system's arrived/finished counts at that instant (the engine always passes it)."""

    def fixed_estimates(self) -> np.ndarray | None:
        """Every bound row's estimate, when ``predict(rows)`` is always ``fixed_estimates()[rows]``
        (computed once in ``bind``, whatever ``known`` says), so a compiled engine may publish them
        without calling ``predict``; None (the default) when estimates change or depend on the system."""
        return None

    def after_prefill(self, rows: np.ndarray) -> np.ndarray | None:
        """Arrival-stage predictors that also read the serving model's prefill state (TRAIL) return
        their updated estimates here; the GPU pays ``gpu_s_per_refresh`` per request. None = no change."""
        return None

    def refresh(self, rows: np.ndarray, generated: np.ndarray) -> np.ndarray:
        """Re-estimated *total* lengths after ``generated`` tokens (only if ``refresh_every``)."""
        raise NotImplementedError(f"predictor {self.name!r} does not refresh")

    def feedback(self, rows: np.ndarray, output_tokens: np.ndarray) -> PendingUpdate | None:
        """True lengths of finished requests; return work for the CPU worker, or None."""
        return None

    def cost(self, hardware: Hardware = DEFAULT_HARDWARE) -> PredictorCost:
        """What this predictor costs on ``hardware`` (the run's engine: GPU and served model)."""
        return FREE

    @property
    def prior_length(self) -> float:
        """The estimate used before a request's own prediction is ready (uninformed: half the cap)."""
        return float(self.workload.output_cap) / 2.0

    def describe(self) -> dict:
        """Settings worth recording in a run's config.json."""
        return {"name": self.name}
