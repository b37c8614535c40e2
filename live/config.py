"""The live scheduler's settings: validated on construction, turned into vLLM engine arguments.

``LiveSchedulerConfig(...).to_engine_args()`` gives the keyword arguments that make a vLLM V1
engine load :class:`live.scheduler.LeapScheduler` through vLLM's own ``scheduler_cls`` setting
and :class:`live.worker_ext.LiveExt` through ``worker_extension_cls``; the config itself travels
to the scheduler in vLLM's ``additional_config`` dict (key ``leap_live``), a plain JSON-able dict
that vLLM hashes and passes to every component. Nothing in vLLM is forked or patched.

Everything vLLM could not honour is refused here, before an engine starts
(:class:`LiveConfigError`, one line): decode slots above the resident cap, a policy or predictor
the live path does not have, a predictor needing features the hook does not capture, a read-out
for another model's hidden size or layer count, a resident cap above the KV capacity, the
text-encoder baseline without its encoder package or head weights.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from core.checks import check_decode_slots
from live.common import LiveConfigError
from policies import POLICIES
from predictors import NO_PREDICTOR
from predictors.live import ARRIVAL_PREDICTORS, LIVE_PREDICTORS, NOT_LIVE, LiveForm

CONFIG_KEY = "leap_live"
#: The entry ``vllm serve --additional-config`` carries for the plugin (``leap_sched.vllm.CONFIG_KEY``).
PLUGIN_CONFIG_KEY = "leap"
SCHEDULER_CLS = "live.scheduler.LeapScheduler"
WORKER_EXTENSION_CLS = "live.worker_ext.LiveExt"

#: Policies the live scheduler applies: those that declare ``live`` (the project's own classes, policies/).
LIVE_POLICIES = tuple(name for name, cls in POLICIES.items() if cls.live)


def predicts_nothing(policy: str, predictor: str) -> bool:
    """The FCFS baseline: a policy that reads no estimates and no predictor (what vLLM's own
    scheduler runs, and the run a capacity is measured with), from the classes' declarations."""
    cls, form = POLICIES.get(policy), LIVE_PREDICTORS.get(predictor)
    return cls is not None and not cls.uses_predictions and form is not None and not form.has_predictor
#: ``SamplingParams.extra_args`` key carrying the raw user prompt (no chat template) to the
#: text-encoder baseline: vLLM hands the scheduler token ids only.
PROMPT_TEXT_KEY = "leap_prompt_text"
#: vLLM's KV block size on CPU (``CpuPlatform``); on GPU pass the engine's own.
CPU_BLOCK_SIZE = 128
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


@dataclass(frozen=True)
class LiveSchedulerConfig:
    """Scheduling inside vLLM: the paper's resident cap / decode-slot semantics (512 / 64) at any scale.

    ``max_resident`` becomes vLLM's ``max_num_seqs`` (requests holding KV); at most ``decode_slots``
    of the residents that are past prefill decode in a step, chosen by ``policy`` after the wait cap
    (``wait_cap`` steps without a decode force a request in; 0 = off), exactly as the simulator's
    engine does. Admission: with an arrival-stage predictor (oracle, ssjf) and a policy that uses
    predictions, new requests enter in the policy's admission-key order (the simulator's
    ``ordered_admission``; ``ordered_admission=False`` keeps vLLM's FCFS); hidden-state predictors
    have no estimate before prefill, so they admit FCFS. ``readout`` is a file from
    ``python -m live.readout`` (leap, leap-rls); ``head_weights`` an ssjf weight file (default:
    the shipped ``predictors/weights/ssjf.npz``, the simulator's own). ``prior_tokens``: the
    estimate an arrival-stage predictor gives before its score lands (the simulator's
    ``prior_length`` = half the workload's cap); None = half the request's ``max_tokens``, right
    only when ``max_tokens`` is the user's cap -- with forced lengths it IS the answer, so a
    replay must set it. ``sync_updates`` (leap-rls, the step clock): each online update is
    applied in the step whose finish completes its batch, not on a background thread, so which
    step first sees the new weights does not depend on the host's speed.
    """

    policy: str = "countdown"
    predictor: str = "leap-rls"
    max_resident: int = 64
    decode_slots: int = 16
    wait_cap: int = 128
    readout: str | None = None
    layer: int | None = None
    update_every: int = 8
    head_weights: str | None = None
    ordered_admission: bool = True
    prior_tokens: float | None = None
    sync_updates: bool = False
    kv_bounded: bool = False   # the engine's KV cache binds (--kv-blocks): order running for vLLM's victim

    def __post_init__(self) -> None:
        if self.policy in POLICIES and self.policy not in LIVE_POLICIES:
            raise LiveConfigError(f"policy {self.policy!r} does not run live: {POLICIES[self.policy].why_not['live']} "
                                  f"(live policies: {', '.join(LIVE_POLICIES)})")
        if self.policy not in LIVE_POLICIES:
            raise LiveConfigError(f"unknown live policy {self.policy!r} (choose from {', '.join(LIVE_POLICIES)})")
        if self.predictor in NOT_LIVE:
            raise LiveConfigError(f"predictor {self.predictor!r} needs {NOT_LIVE[self.predictor]}, which the live "
                                  f"hook does not capture (live predictors: {', '.join(LIVE_PREDICTORS)})")
        if self.predictor not in LIVE_PREDICTORS:
            raise LiveConfigError(f"unknown live predictor {self.predictor!r} "
                                  f"(choose from {', '.join(LIVE_PREDICTORS)})")
        for name in ("max_resident", "decode_slots", "update_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LiveConfigError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if isinstance(self.wait_cap, bool) or not isinstance(self.wait_cap, int) or self.wait_cap < 0:
            raise LiveConfigError(f"wait-cap must be an integer >= 0, got {self.wait_cap!r}")
        check_decode_slots(self.decode_slots, self.max_resident, LiveConfigError)
        if POLICIES[self.policy].uses_predictions and not self.form.has_predictor:
            raise LiveConfigError(f"policy {self.policy!r} needs a predictor "
                                  f"({', '.join(n for n in LIVE_PREDICTORS if n != NO_PREDICTOR)})")
        if self.layer is not None and (isinstance(self.layer, bool) or not isinstance(self.layer, int)
                                       or self.layer < 0):
            raise LiveConfigError(f"layer must be an integer >= 0, got {self.layer!r}")
        if self.needs_hook:
            if not self.readout:
                raise LiveConfigError(f"predictor {self.predictor!r} needs a read-out file (readout=...; "
                                      "make one with python -m live.readout --train TRACE --out FILE)")
            info = self.readout_file().info     # readable, the right feature, the same layer
            if self.layer is not None and self.layer != info["layer"]:
                raise LiveConfigError(f"read-out {self.readout} was trained on layer {info['layer']}, "
                                      f"not layer {self.layer}")
        elif self.readout is not None:
            raise LiveConfigError(f"predictor {self.predictor!r} uses no read-out; drop readout=")
        if self.prior_tokens is not None and (isinstance(self.prior_tokens, bool)
                                              or not isinstance(self.prior_tokens, (int, float))
                                              or not math.isfinite(self.prior_tokens) or self.prior_tokens <= 0):
            raise LiveConfigError(f"prior-tokens must be a number > 0, got {self.prior_tokens!r}")
        if not isinstance(self.sync_updates, bool):
            raise LiveConfigError(f"sync-updates must be true or false, got {self.sync_updates!r}")
        if not isinstance(self.ordered_admission, bool):
            raise LiveConfigError(f"ordered-admission must be true or false, got {self.ordered_admission!r}")
        if self.form.prompt_text:
            self.head_artifact()                # readable ssjf weights
            self.text_encoder_dir()             # installed
        elif self.head_weights is not None:
            raise LiveConfigError(f"predictor {self.predictor!r} uses no head weights; drop head_weights=")

    # ------------------------------------------------------------------ derived
    @property
    def form(self) -> LiveForm:
        """What the predictor's class declares of its live form (``predictors.live``)."""
        return LIVE_PREDICTORS[self.predictor]

    @property
    def needs_hook(self) -> bool:
        """True when the predictor reads the serving model's hidden state (the worker hook)."""
        return LIVE_PREDICTORS[self.predictor].needs_hook

    @property
    def hook_layer(self) -> int | None:
        return self.readout_file().info["layer"] if self.needs_hook else None

    def readout_file(self):
        from live.readout import load_readout

        return load_readout(self.readout)

    @property
    def orders_admission(self) -> bool:
        """True when new requests are admitted in the policy's admission-key order."""
        from policies import make_policy

        return (self.ordered_admission and self.predictor in ARRIVAL_PREDICTORS
                and make_policy(self.policy).uses_predictions)

    def head_weights_path(self) -> Path:
        from predictors.heads import shipped_path

        return Path(self.head_weights) if self.head_weights else shipped_path(self.predictor)

    def head_artifact(self):
        """The baseline's trained head (``predictors.heads.Artifact``), refused unless it is one of ours."""
        from predictors.heads import load_artifact

        path = self.head_weights_path()
        if not path.is_file():
            raise LiveConfigError(f"{self.predictor} head weights {path}: no such file (train them with "
                                  "scripts/train_baselines.py, or pass head_weights=)")
        art = load_artifact(path, "shipped" if self.head_weights is None else "file")
        if art is None:
            raise LiveConfigError(f"{self.predictor} head weights {path}: not a readable weight file")
        if art.method != self.predictor:
            raise LiveConfigError(f"head weights {path} are for {art.method!r}, not {self.predictor!r}")
        if art.settings.get("column", "text_embedding") != "text_embedding":
            raise LiveConfigError(f"head weights {path} were trained on {art.settings.get('column')!r}; "
                                  "live, the text encoder gives text_embedding only")
        return art

    @staticmethod
    def text_encoder_dir() -> Path:
        from capture.features import ENCODER_PACKAGE, encoder_dir

        try:
            d = encoder_dir()
        except Exception as e:                  # CaptureError: not installed
            raise LiveConfigError(f"the live text encoder needs the package {ENCODER_PACKAGE}: {e}") from None
        if not (d / "config.json").is_file():
            raise LiveConfigError(f"the live text encoder's model files are missing at {d}")
        return d

    # ------------------------------------------------------------------ vLLM
    def to_engine_args(self) -> dict:
        """vLLM ``EngineArgs`` keywords that turn this scheduler on (merge with the model's own).

        The hook needs vLLM's in-process ``uni`` executor (the worker extension taps layer k when the
        model loads, before vLLM compiles it; the hook hands predictions to the scheduler in the same
        process); set ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` before the engine is built. Compiled and
        eager mode both work (``enforce_eager`` is the caller's choice).
        """
        args = {"scheduler_cls": SCHEDULER_CLS, "max_num_seqs": self.max_resident,
                "additional_config": {CONFIG_KEY: self.to_dict()},
                "async_scheduling": False, "distributed_executor_backend": "uni"}
        if self.needs_hook:
            args["worker_extension_cls"] = WORKER_EXTENSION_CLS
        return args

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LiveSchedulerConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LiveConfigError(f"unknown live-scheduler setting(s): {', '.join(unknown)}")
        return cls(**data)

    def check_model(self, model_dir: str | Path, *, kv_cache_gib: float, dtype: str = "float32",
                    block_size: int = CPU_BLOCK_SIZE, tensor_parallel_size: int = 1) -> dict:
        """Refuse what this model and KV space cannot hold; return the model facts used.

        KV capacity = ``kv_cache_gib`` / (block_size x 2 x layers x kv_heads x head_dim x dtype
        bytes) blocks; every resident request holds at least one block, so ``max_resident`` above
        that many blocks can never be resident at once. A read-out must match the model's hidden
        size, layer count and (when both name one) model id. Tensor parallel N: the heads and KV
        heads must split N ways; each rank holds kv_heads / N of them in its own KV space.
        """
        cfg_path = Path(model_dir) / "config.json"
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as e:
            raise LiveConfigError(f"cannot read {cfg_path}: {e}") from None
        if not isinstance(cfg, dict):
            raise LiveConfigError(f"{cfg_path}: expected a JSON object")
        try:
            hidden = int(cfg["hidden_size"])
            layers = int(cfg["num_hidden_layers"])
            heads = int(cfg["num_attention_heads"])
            kv_heads = int(cfg.get("num_key_value_heads", heads))
            head_dim = int(cfg.get("head_dim") or hidden // heads)
        except (KeyError, TypeError, ValueError) as e:
            raise LiveConfigError(f"{cfg_path}: missing or bad model field {e}") from None
        if dtype not in DTYPE_BYTES:
            raise LiveConfigError(f"unknown dtype {dtype!r} (choose from {', '.join(DTYPE_BYTES)})")
        if not (kv_cache_gib > 0 and math.isfinite(kv_cache_gib)):
            raise LiveConfigError(f"KV cache space must be > 0 GiB, got {kv_cache_gib}")
        tp = tensor_parallel_size
        if tp < 1 or heads % tp or kv_heads % tp:
            raise LiveConfigError(f"--tensor-parallel-size {tp}: the model's {heads} attention heads and {kv_heads} KV "
                                  f"heads must split evenly over the ranks (tensor parallel size >= 1)")
        bytes_per_block = block_size * 2 * layers * (kv_heads // tp) * head_dim * DTYPE_BYTES[dtype]
        blocks = int(kv_cache_gib * 2**30 // bytes_per_block)
        if self.max_resident > blocks:
            raise LiveConfigError(f"max-resident {self.max_resident} exceeds the KV capacity: {kv_cache_gib:g} GiB "
                                  f"holds {blocks} blocks of {block_size} tokens, one per resident request at least")
        facts = {"hidden_size": hidden, "num_layers": layers, "kv_blocks": blocks, "block_size": block_size}
        if self.needs_hook:
            self.check_readout_fits(hidden, layers, model_id_of(model_dir), f"the model at {model_dir}")
        return facts

    def check_readout_fits(self, hidden: int, layers: int, model_id: str | None, model: str) -> None:
        """The read-out's hidden size, layer and (when both name one) model id match the model
        (``model``: how a refusal names it), before the hook first reads a hidden state."""
        info = self.readout_file().info
        if info["hidden_size"] != hidden:
            raise LiveConfigError(f"read-out {self.readout} is for hidden size {info['hidden_size']}, "
                                  f"but {model} has {hidden}")
        if not 0 <= info["layer"] < layers:
            raise LiveConfigError(f"read-out {self.readout} taps layer {info['layer']}, but {model} has "
                                  f"{layers} layers")
        if model_id and info.get("model_id") and model_id != info["model_id"]:
            raise LiveConfigError(f"read-out {self.readout} was trained on {info['model_id']}, not on {model_id}")


def model_id_of(model: str | Path) -> str | None:
    """The model id: the project's ``leap_source.json`` in a local model folder, else the name given
    (None for a local folder without one)."""
    source = Path(model) / "leap_source.json"
    if source.is_file():
        try:
            return json.loads(source.read_text()).get("model_id")
        except (OSError, ValueError, AttributeError):
            return None
    return None if Path(model).exists() else str(model)
