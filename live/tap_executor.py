"""``distributed_executor_backend="live.tap_executor.TapExecutor"``: vLLM's one-process executor that
taps LEAP's layer (:mod:`live.tap`) between loading the model and vLLM's first forward, the one
torch.compile traces. A tap added later would never be part of the compiled graph.
"""

from __future__ import annotations

from vllm.v1.executor.uniproc_executor import UniProcExecutor

from live.tap import configured_layer


class TapExecutor(UniProcExecutor):
    """vLLM's ``uni`` executor plus the tap of the configured read-out's layer (when one is configured)."""

    def _init_executor(self) -> None:
        super()._init_executor()
        self.leap_tap: dict | None = None
        layer = configured_layer(self.vllm_config.additional_config)
        if layer is not None and self.vllm_config.parallel_config.worker_extension_cls:
            self.leap_tap = self.collective_rpc("lv_tap", args=(layer,))[0]
