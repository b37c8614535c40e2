"""Arrow schemas and table builders for the trace files (docs/traces.md)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from core.prefix_hashes import token_block_hashes
from core.trace import vector_array

#: tokens per block of the recorded ``prefix_hashes`` (vLLM's default block size; docs/traces.md)
PREFIX_BLOCK = 16

ENC_DIM = 384


def gen_table(fins, by_id, ref_len, max_tokens, names, layers, hidden, keep_text) -> pa.Table:
    rows: dict[str, list] = {k: [] for k in ("request_id", "domain", "prompt_id", "prompt_text", "prompt_tokens",
                            "output_tokens", "finish_reason", "max_tokens", "arrival_s", "ttft_s",
                            "e2e_s", "token_times_s", "reference_output_tokens", "prefix_hashes")}
    vecs: dict[str, list] = {n: [] for n in names}
    for f in fins:
        p = by_id[f.request.request_id]
        rows["request_id"].append(p.request_id)
        rows["domain"].append(p.domain)
        rows["prompt_id"].append(p.prompt_id)
        rows["prompt_text"].append(p.text if (keep_text and p.keep_text) else None)
        rows["prompt_tokens"].append(len(f.request.prompt_token_ids))
        rows["output_tokens"].append(int(f.output_tokens))
        rows["finish_reason"].append(f.finish_reason)
        rows["max_tokens"].append(int(max_tokens))
        rows["arrival_s"].append(f.arrival_s)
        tt = [float(x) for x in f.token_times_s]
        rows["ttft_s"].append(tt[0] if tt else None)
        rows["e2e_s"].append(tt[-1] if tt else None)
        rows["token_times_s"].append(tt or None)
        rows["reference_output_tokens"].append(ref_len.get(p.request_id))
        rows["prefix_hashes"].append(token_block_hashes(f.request.prompt_token_ids, PREFIX_BLOCK))
        for n, k in zip(names, layers):
            vecs[n].append(f.last[k])
    arrays = [
        pa.array(rows["request_id"], pa.string()),
        pa.array(rows["domain"], pa.string()),
        pa.array(rows["prompt_id"], pa.string()),
        pa.array(rows["prompt_text"], pa.string()),
        pa.array(rows["prompt_tokens"], pa.int32()),
        pa.array(rows["output_tokens"], pa.int32()),
        pa.array(rows["finish_reason"], pa.string()),
        pa.array(rows["max_tokens"], pa.int32()),
        pa.array(rows["arrival_s"], pa.float64()),
        pa.array(rows["ttft_s"], pa.float64()),
        pa.array(rows["e2e_s"], pa.float64()),
        pa.array(rows["token_times_s"], pa.list_(pa.float64())),
        pa.array(rows["reference_output_tokens"], pa.int32()),
        pa.array(rows["prefix_hashes"], pa.list_(pa.int64())),
    ]
    cols = list(rows)
    for n in names:
        arrays.append(vector_array(vecs[n], hidden))
        cols.append(n)
    return pa.table(arrays, names=cols)


def dec_table(fins, hidden) -> pa.Table:
    rid, gen, layer, vecs = [], [], [], []
    for f in fins:
        for g, k, v in f.decode:
            if g >= f.output_tokens:  # defensive: only states of tokens that were generated
                continue
            rid.append(f.request.request_id)
            gen.append(int(g))
            layer.append(int(k))
            vecs.append(v)
    return pa.table({
        "request_id": pa.array(rid, pa.string()),
        "generated_tokens": pa.array(gen, pa.int32()),
        "layer": pa.array(layer, pa.int16()),
        "vector": vector_array(vecs, hidden),
    })


STEP_COLS = ["run", "run_step", "wall_start_s", "step_s", "prefill_requests", "prefill_tokens",
             "decode_requests", "decode_tokens", "kv_usage", "decode_context", "prefill_sq",
             "probe_s", "probe_mem_s"]
# decode_context: sum over decoded requests of prompt + generated so far (the keys each attends);
# prefill_sq: sum over prefill chunks of chunk x (computed before + chunk), causal-attention work;
# probe_s: the drift probe's time after this step (null where not measured). All three are null
# in steps recorded before they existed. probe_mem_s: the memory-bandwidth probe's time (a sum
# over 64 MiB, beyond the L3) after this step, every 4th probed step (null otherwise and in older
# steps).


def steps_table(rows) -> pa.Table:
    types = {"run": pa.int32(), "run_step": pa.int32(), "wall_start_s": pa.float64(),
             "step_s": pa.float64(), "prefill_requests": pa.int32(), "prefill_tokens": pa.int32(),
             "decode_requests": pa.int32(), "decode_tokens": pa.int32(),
             "kv_usage": pa.float64(), "decode_context": pa.int64(), "prefill_sq": pa.int64(),
             "probe_s": pa.float64(), "probe_mem_s": pa.float64()}
    out = {}
    for c in STEP_COLS:
        vals = [r.get(c) for r in rows]
        if c in ("kv_usage", "probe_s", "probe_mem_s"):
            vals = [None if (v is None or v != v) else float(v) for v in vals]
        out[c] = pa.array(vals, types[c])
    return pa.table(out)


def feat_table(cols: dict, hidden: int) -> pa.Table:
    arrays, names = [pa.array(cols["request_id"], pa.string())], ["request_id"]
    for k, v in cols.items():
        if k == "request_id" or not v:
            continue
        if k == "text_embedding":
            arrays.append(vector_array(v, ENC_DIM, np.float32))
        elif k.startswith("check_"):
            arrays.append(vector_array(v, hidden, np.float32))
        else:
            arrays.append(vector_array(v, hidden))
        names.append(k)
    return pa.table(arrays, names=names)
