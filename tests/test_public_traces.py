"""Public lengths-only traces (Azure LLM inference, Mooncake, generic CSV/Parquet) imported into the
trace contract, replayed by ``simulate --trace FILE``, and tiled for scaling studies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.importers import IMPORTERS, detect_format
from core.trace import TraceError, import_trace, load_trace, tile_trace, trace_from_arrays, validate_table
from experiments.cli import main
from predictors.base import PredictorOptions

ARRIVALS = Path(__file__).resolve().parents[2] / "shared" / "data" / "arrivals"
AZURE_CONV = ARRIVALS / "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = ARRIVALS / "AzureLLMInferenceTrace_code.csv"
MOONCAKE = ARRIVALS / "mooncake_conversation_trace.jsonl"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


AZURE_SLICE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000000,12,0
2023-11-16 18:15:51.2224670,879,55
"""


def test_azure_slice_by_hand(tmp_path):
    trace = import_trace(write(tmp_path, "AzureLLMInferenceTrace_conv.csv", AZURE_SLICE))
    # the 0-output row (file row 2) is dropped; ids keep naming the file's rows
    assert list(trace.request_id) == ["azure-conv-000000", "azure-conv-000001", "azure-conv-000003"]
    assert list(trace.domain) == ["azure-conv"] * 3
    assert trace.prompt_tokens.tolist() == [374, 396, 879]
    assert trace.output_tokens.tolist() == [44, 109, 55]
    assert trace.arrival_s == pytest.approx([0.0, 4.314579, 4.541877], abs=1e-9)
    assert trace.max_tokens.tolist() == [109] * 3 and trace.output_cap == 109
    assert set(trace.table.column("finish_reason").to_pylist()) == {"stop"}
    assert trace.metadata["import"]["dropped_zero_tokens"] == 1 and trace.metadata["import"]["rows"] == 4
    assert trace.name == "AzureLLMInferenceTrace_conv" and trace.metadata["lengths_only"] is True
    again = import_trace(tmp_path / "AzureLLMInferenceTrace_conv.csv")
    assert again.content_hash == trace.content_hash
    other = import_trace(write(tmp_path, "AzureLLMInferenceTrace_conv.csv", AZURE_SLICE.replace(",55", ",56")))
    assert other.content_hash != trace.content_hash


def test_mooncake_slice_by_hand(tmp_path):
    lines = [{"timestamp": 1500, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]},
             {"timestamp": 1500, "input_length": 7322, "output_length": 490, "hash_ids": [0, 2]},
             {"timestamp": 3750, "input_length": 20, "output_length": 3, "hash_ids": [3]}]
    path = write(tmp_path, "mooncake_conversation_trace.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    assert detect_format(path) == "mooncake"
    trace = load_trace(path)
    assert list(trace.request_id) == [f"mooncake-conversation-00000{i}" for i in range(3)]
    assert trace.arrival_s.tolist() == [0.0, 0.0, 2.25]   # milliseconds, from the first request
    assert trace.prompt_tokens.tolist() == [6758, 7322, 20] and trace.output_tokens.tolist() == [500, 490, 3]
    assert trace.output_cap == 500
    # hash_ids, chained, as the prefix identity (docs/traces.md "Prefix hashes"): rows 0 and 1 share block 0
    hashes = trace.table.column("prefix_hashes").to_pylist()
    assert hashes[0][0] == hashes[1][0] and hashes[0][1] != hashes[1][1] and trace.metadata["prefix_block_size"] == 512


@pytest.mark.parametrize("header, row_fmt, times", [
    ("prompt_tokens,output_tokens,arrival_s", "{p},{o},{t}", [0.5, 1.0, 3.0]),
    ("input_tokens,GeneratedTokens,timestamp_ms", "{p},{o},{t_ms}", [0.5, 1.0, 3.0]),
    ("Input_Length,output_length", "{p},{o}", None),
])
def test_generic_csv_column_names(tmp_path, header, row_fmt, times):
    rows = [(10, 5, 0.5), (20, 7, 1.0), (30, 9, 3.0)]
    text = header + "\n" + "".join(row_fmt.format(p=p, o=o, t=t, t_ms=int(t * 1000)) + "\n" for p, o, t in rows)
    path = write(tmp_path, "my_lengths.csv", text)
    assert detect_format(path) == "csv"
    trace = load_trace(path)
    assert list(trace.request_id) == ["my-lengths-000000", "my-lengths-000001", "my-lengths-000002"]
    assert trace.prompt_tokens.tolist() == [10, 20, 30] and trace.output_tokens.tolist() == [5, 7, 9]
    if times is None:
        assert trace.arrival_s is None
    else:
        assert trace.arrival_s.tolist() == pytest.approx([t - times[0] for t in times])


def test_generic_parquet(tmp_path):
    path = tmp_path / "counts.parquet"
    pq.write_table(pa.table({"input_length": [3, 4], "output_tokens": [8, 1], "timestamp": [10.0, 12.5]}), path)
    assert detect_format(path) == "parquet"
    trace = load_trace(path)
    assert trace.arrival_s.tolist() == [0.0, 2.5] and list(trace.request_id) == ["counts-000000", "counts-000001"]


def test_importers_registered_in_one_place():
    assert set(IMPORTERS) == {"azure", "mooncake", "csv", "parquet"}


@pytest.mark.parametrize("name, text, message", [
    ("a.csv", "foo,bar\n1,2\n", "no prompt and output token columns"),
    ("a.csv", "prompt_tokens,output_tokens\n5,-1\n", "output_tokens: row 0: negative token count"),
    ("a.csv", "prompt_tokens,output_tokens\n5,1\n,3\n", "prompt_tokens: row 1: missing value"),
    ("a.csv", "prompt_tokens,output_tokens\n5,1.5\n", "row 0: 1.5 is not a whole token count"),
    ("a.csv", "prompt_tokens,output_tokens\n0,1\n4,0\n", "every one of its 2 rows has 0 prompt or 0 output"),
    ("a.csv", "prompt_tokens,output_tokens\n", "has no requests"),
    ("AzureLLMInferenceTrace_x.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,5\n", "not a readable CSV"),
    ("m.jsonl", '{"ts": 0, "input_length": 1}\n', "not a Mooncake trace"),
    ("m.jsonl", "not json\n", "first line is not a JSON object"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 2}\n{"timestamp": \n', "not readable JSON"),
])
def test_bad_files_one_line_exit_2(tmp_path, capsys, name, text, message):
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError, match=message):
        import_trace(path)
    assert main(["--trace", str(path), "--arrivals", "recorded", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and str(path) in err


def test_lengths_only_predictors_refused_by_name(tmp_path, capsys):
    path = write(tmp_path, "AzureLLMInferenceTrace_conv.csv", AZURE_SLICE)
    assert main(["--trace", str(path), "--predictor", "none,leap", "--arrivals", "recorded"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "feat_last" in err and "use oracle, noisy-oracle or none" in err


@pytest.mark.skipif(not AZURE_CONV.is_file(), reason="../shared/data/arrivals not present")
def test_simulate_first_500_azure_rows_as_recorded_and_at_a_load(tmp_path, capsys):
    lines = AZURE_CONV.read_text().splitlines(keepends=True)[:501]
    path = write(tmp_path, "AzureLLMInferenceTrace_conv.csv", "".join(lines))
    out = tmp_path / "runs"
    assert main(["--trace", str(path), "--arrivals", "recorded", "--predictor", "none,oracle",
                 "--json", "--out", str(out), "--jobs", "1"]) == 0
    fcfs, oracle = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert fcfs["arrived"] == fcfs["completed"] == oracle["completed"] == 500
    assert fcfs["load"] is None and oracle["spearman"] == pytest.approx(1.0)
    assert fcfs["trace"] == "AzureLLMInferenceTrace_conv"
    requests = pq.read_table(out / "none-fcfs-recorded-seed0" / "requests.parquet").to_pydict()
    trace = load_trace(path)
    by_id = dict(zip(requests["request_id"], requests["arrival_s"]))
    assert [by_id[r] for r in trace.request_id] == pytest.approx(trace.arrival_s.tolist())
    config = json.loads((out / "none-fcfs-recorded-seed0" / "config.json").read_text())
    assert not str(config["trace"]).startswith("/")
    # the same file at a load multiple: its own gaps, stretched; and the noisy oracle
    assert main(["--trace", str(path), "--arrivals", "trace", "--load", "1.5x", "--predictor", "noisy-oracle",
                 "--noise-mae", "50", "--json", "--jobs", "1"]) == 0
    [noisy] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert noisy["load"] == 1.5 and noisy["completed"] == 500 and 0 < noisy["spearman"] < 1


@pytest.mark.skipif(not (AZURE_CONV.is_file() and AZURE_CODE.is_file() and MOONCAKE.is_file()),
                    reason="../shared/data/arrivals not present")
def test_real_public_traces_import_whole():
    for path, rows, source, last in [(AZURE_CONV, 19366, "azure-conv", 3501.721937),
                                     (AZURE_CODE, 8819, "azure-code", 3435.948056),
                                     (MOONCAKE, 12031, "mooncake-conversation", 3536.999)]:
        trace = load_trace(path)
        assert len(trace) == rows and trace.metadata["import"]["dropped_zero_tokens"] == 0
        assert trace.request_id[0] == f"{source}-000000" and trace.domain[0] == source
        assert trace.arrival_s[0] == 0.0 and trace.arrival_s.max() == pytest.approx(last, abs=1e-6)
        assert (np.diff(trace.arrival_s) >= 0).all()


def test_tiling_deterministic_gaps_repeated_ids_suffixed():
    base = trace_from_arrays("t", [5, 6, 7], [3, 2, 1], arrival_s=[0.0, 1.0, 4.0])
    tiled = tile_trace(base, 8)
    assert list(tiled.request_id) == ["r0#0", "r1#0", "r2#0", "r0#1", "r1#1", "r2#1", "r0#2", "r1#2"]
    # each copy starts one mean gap (2 s) after the previous copy's last arrival (4 s): period 6 s
    assert tiled.arrival_s.tolist() == [0.0, 1.0, 4.0, 6.0, 7.0, 10.0, 12.0, 13.0]
    assert tiled.output_tokens.tolist() == [3, 2, 1, 3, 2, 1, 3, 2] and tiled.name == "t-x8"
    validate_table(tiled.table, tiled.metadata, Path("tiled"))   # valid by construction: tile_trace skips it
    again = tile_trace(base, 8)
    assert again.content_hash == tiled.content_hash and again.table.equals(tiled.table)
    assert tile_trace(base, 9).content_hash != tiled.content_hash
    shuffled = tile_trace(base, 8, shuffle_seed=0)
    assert "arrival_s" not in shuffled.table.column_names
    assert shuffled.table.equals(tile_trace(base, 8, shuffle_seed=0).table)
    assert sorted(shuffled.request_id[:3]) == ["r0#0", "r1#0", "r2#0"]


def test_simulate_tile(tmp_path, capsys):
    path = write(tmp_path, "AzureLLMInferenceTrace_conv.csv", AZURE_SLICE)
    assert main(["--trace", str(path), "--arrivals", "recorded", "--tile", "30", "--predictor", "oracle",
                 "--json", "--out", str(tmp_path / "run")]) == 0
    [summary] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert summary["completed"] == 30 and summary["trace"] == "AzureLLMInferenceTrace_conv-x30"
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["tile"] == 30 and config["requests_used"] == 30
    assert main(["--trace", str(path), "--arrivals", "recorded", "--requests", "30"]) == 2
    assert "--tile N" in capsys.readouterr().err


def test_ray_sweep_ships_the_trace_once_per_worker(tmp_path):
    """Six runs on a one-CPU local Ray: one trace put by the driver, fetched by one worker process
    once (not per run), and the same summaries as the local executor."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (extra 'ray')")
    from experiments.sweep import run_many
    from simulator.runner import RunConfig
    from simulator.workload import ArrivalSpec

    rows = "".join(f"2023-11-16 18:15:{i // 10:02d}.{i % 10}000000,{50 + 7 * i},{5 + (13 * i) % 40}\n"
                   for i in range(120))
    path = write(tmp_path, "AzureLLMInferenceTrace_conv.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    configs = [RunConfig(trace=str(path), predictor=p, policy="fcfs" if p == "none" else "countdown", load=None,
                         arrivals=ArrivalSpec("recorded"), seed=s, predictor_options=PredictorOptions(seed=s, noise_mae=20))
               for p in ("none", "oracle", "noisy-oracle") for s in (0, 1)]
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        stats = {}
        shipped = run_many(configs, executor="ray", stats=stats, out=tmp_path / "ray")
    finally:
        ray.shutdown()
    assert stats == {"traces_shipped": 1, "trace_fetches": 1}
    local = run_many(configs, jobs=1, out=tmp_path / "local")

    def simulated(rows):
        return [{k: v for k, v in r.items() if k != "sim_cpu_s"} for r in rows]

    assert simulated(shipped) == simulated(local)
    assert (tmp_path / "ray" / "results.parquet").read_bytes() == (tmp_path / "local" / "results.parquet").read_bytes()


def _mooncake_slice(folder: Path) -> Path:
    lines = [{"timestamp": 100 * i, "input_length": 520 + 8 * (i % 3), "output_length": 5 + i % 4,
              "hash_ids": [0, 1 + i % 2] if i % 3 else [7]} for i in range(24)]
    return write(folder, "mooncake_conversation_trace.jsonl", "".join(json.dumps(x) + "\n" for x in lines))


def test_mooncake_as_arrivals_is_its_own_requests_at_its_own_times(tmp_path, capsys):
    """``--arrivals FILE.jsonl`` = ``--trace FILE --arrivals trace``: the same bytes; with the prefix
    cache on (KV blocks), the table shows the hit rate."""
    path = _mooncake_slice(tmp_path)
    common = ["--engine", "unit", "--predictor", "none", "--kv-blocks", "400", "--block-size", "16", "--load", "1x"]
    assert main(["--arrivals", str(path), *common, "--out", str(tmp_path / "a")]) == 0
    table = capsys.readouterr().out
    assert main(["--trace", str(path), "--arrivals", "trace", *common, "--out", str(tmp_path / "b"), "--quiet"]) == 0
    for name in ("results.csv", "results.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["prefix_hit_rate"] > 0 and "hit rate" in table and f"{summary['prefix_hit_rate']:.3f}" in table


def test_mooncake_arrivals_refuse_another_trace(tmp_path, capsys):
    path = _mooncake_slice(tmp_path)
    assert main(["--arrivals", str(path), "--trace", "sharegpt", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "carries its own requests" in err[0] and not (tmp_path / "o").exists()
    assert main(["--arrivals", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "no such file" in capsys.readouterr().err
