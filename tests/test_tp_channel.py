"""The cross-process hook channel for tensor parallel > 1 (live/tp_channel.py) and the TP command."""

from __future__ import annotations

import pickle
import shlex

import pytest

torch = pytest.importorskip("torch")

from leap_sched.vllm.command import serve_argv, serve_command  # noqa: E402
from live.config import LiveSchedulerConfig  # noqa: E402
from live.tp_channel import FileChannelReader  # noqa: E402


def test_frames_arrive_whole_in_order_with_the_hook_time():
    reader = FileChannelReader()
    try:
        writer = pickle.loads(pickle.dumps(reader.writer()))     # what collective_rpc hands each rank
        assert writer.folder == reader.folder and writer.next_frame == 0
        assert reader.drain() == []
        writer.hook_s, writer.hook_calls = 0.25, 3
        writer.pending.append((["a", "b"], torch.tensor([4.0, 9.0]), torch.ones(2, 3)))
        writer.hook_s = 0.5
        writer.pending.append((["c"], torch.tensor([16.0]), None))
        open(f"{reader.folder}/000000000002.npz.part", "wb").close()     # a frame being written: not read
        peeked = [(i, p.tolist()) for i, p in reader.peek()]     # read in place (a request freed in prefill)
        assert peeked == [(["a", "b"], [4.0, 9.0]), (["c"], [16.0])] and reader.next_frame == 0
        (ids, pred, vec), (ids2, pred2, vec2) = reader.drain()
        assert (ids, pred.tolist(), vec.shape, ids2, pred2.tolist(), vec2) == (["a", "b"], [4.0, 9.0], (2, 3),
                                                                            ["c"], [16.0], None)
        assert (reader.take_hook_s(), reader.hook_calls) == (0.75, 3)
        assert reader.drain() == [] and reader.next_frame == 2 and reader.peek() == []
    finally:
        reader.close()
    assert not __import__("os").path.exists(reader.folder)


def test_the_worker_side_forgets_finished_requests_only_when_it_holds_many():
    reader = FileChannelReader()
    try:
        writer = reader.writer()
        writer.seen.update(str(i) for i in range(68))
        writer.forget_finished({"1": None, "2": None})
        assert len(writer.seen) == 68                        # 68 <= 2 * 2 + 64: kept
        writer.seen.add("x")
        writer.forget_finished({"1": None, "2": None})
        assert writer.seen == {"1", "2"}
    finally:
        reader.close()


def test_tp2_command_names_vllms_mp_executor_and_binds_one_core_per_rank():
    cfg = LiveSchedulerConfig(policy="countdown", predictor="oracle", max_resident=8, decode_slots=2)
    argv = serve_argv(cfg, "some/model", launcher="module", tensor_parallel_size=2)
    at = argv.index("--distributed-executor-backend")
    assert argv[at + 1] == "mp" and argv[argv.index("--tensor-parallel-size") + 1] == "2"
    command = serve_command(cfg, "some/model", launcher="module", kv_cache_gib=1, tensor_parallel_size=2)
    assert command.startswith("VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND='0|1' python -m ")
    assert shlex.split(command)[2:] == argv          # the env prefix, then the argv
    one = serve_argv(cfg, "some/model", launcher="module")
    assert "--tensor-parallel-size" not in one and one[one.index("--distributed-executor-backend") + 1] \
        == "uni"                                     # vLLM's own executor at tensor parallel 1 too
    assert "VLLM_CPU_OMP_THREADS_BIND" not in serve_command(cfg, "some/model", launcher="module", kv_cache_gib=1)
