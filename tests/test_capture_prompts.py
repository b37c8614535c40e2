"""Prompt files in common formats, the shared data folder, and what trace metadata says about them
(capture/prompts.py). Standard library + pyarrow only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capture import CaptureError  # noqa: E402
from capture.cli import main  # noqa: E402
from capture.prompts import load_prompts, shared_data_dir, source_name  # noqa: E402


def _jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _one(spec: str):
    prompts = load_prompts([spec])
    assert len(prompts) == 1
    return prompts[0]


def test_mt_bench_turns_give_the_first_turn(tmp_path):
    f = _jsonl(tmp_path / "mt_bench.jsonl", [{"question_id": 81, "category": "writing",
                                               "turns": ["Write a blog post.", "Rewrite it."],
                                               "reference": ["A post.", "Rewritten."]}])
    p = _one(f"jsonl:{f}")
    assert (p.text, p.prompt_id, p.domain, p.reference) == ("Write a blog post.", "81", "mt_bench", "A post.")


def test_sharegpt_conversations_give_the_first_human_turn(tmp_path):
    f = tmp_path / "sg.json"
    f.write_text(json.dumps([{"id": "c1", "conversations": [
        {"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hello there"},
        {"from": "gpt", "value": "Hi!"}, {"from": "human", "value": "Later turn"}]}]))
    p = _one(f"json:{f}")
    assert (p.text, p.prompt_id, p.reference) == ("Hello there", "c1", "Hi!")


def test_openai_messages_with_text_parts(tmp_path):
    f = _jsonl(tmp_path / "chat.jsonl", [
        {"messages": [{"role": "system", "content": "sys"},
                      {"role": "user", "content": [{"type": "text", "text": "part one"},
                                                   {"type": "image_url", "image_url": {"url": "x"}},
                                                   {"type": "text", "text": "part two"}]},
                      {"role": "assistant", "content": "answer"}]},
        {"messages": [{"role": "user", "content": "plain"}]}])
    prompts = load_prompts([f"jsonl:{f}"])
    assert [p.text for p in prompts] == ["part one\npart two", "plain"]
    assert [p.prompt_id for p in prompts] == ["00000", "00001"]
    assert prompts[0].reference == "answer"


def test_alpaca_instruction_and_input_in_csv(tmp_path):
    f = tmp_path / "alpaca.csv"
    f.write_text('instruction,input,output\n"Summarise, briefly",The text.,Done\nSay hi,,Hi\n')
    prompts = load_prompts([f"csv:{f}"])
    assert [p.text for p in prompts] == ["Summarise, briefly\n\nThe text.", "Say hi"]
    assert prompts[0].reference == "Done"


def test_parquet_with_a_prompt_column_and_domain(tmp_path):
    f = tmp_path / "set.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "domain": ["x", None], "id": [3, 4]}), f)
    prompts = load_prompts([f"parquet:{f}"])
    assert [(p.domain, p.prompt_id, p.text) for p in prompts] == [("x", "3", "a"), ("set", "4", "b")]


def test_text_and_question_fields(tmp_path):
    f = _jsonl(tmp_path / "t.jsonl", [{"text": "from text"}, {"question": "from question", "answer": "4"}])
    assert [p.text for p in load_prompts([f"jsonl:{f}"])] == ["from text", "from question"]


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet"])
def test_record_without_a_prompt_names_file_place_and_fields(tmp_path, kind):
    good, bad = {"prompt": "fine"}, {"foo": "1", "bar": "2"}
    f = tmp_path / f"p.{kind}"
    if kind == "jsonl":
        _jsonl(f, [good, bad])
        where = "line 2"
    elif kind == "json":
        f.write_text(json.dumps([good, bad]))
        where = "record 1"
    elif kind == "csv":
        f.write_text("prompt,foo,bar\nfine,,\n,1,2\n")
        where = "line 3"
    else:
        pq.write_table(pa.table({"prompt": ["fine", None], "foo": [None, "1"], "bar": [None, "2"]}), f)
        where = "row 1"
    with pytest.raises(CaptureError) as err:
        load_prompts([f"{kind}:{f}"])
    msg = str(err.value)
    assert "\n" not in msg and str(f) in msg and where in msg and "bar" in msg and "foo" in msg, msg


def test_bad_prompt_files_exit_2_with_one_line(tmp_path, capsys):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 8}))
    (model / "model.safetensors").write_bytes(b"")
    (tmp_path / "list.json").write_text('{"not": "a list"}')
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    for spec in (f"json:{tmp_path}/list.json", f"parquet:{tmp_path}/x.parquet", f"csv:{tmp_path}/none.csv"):
        out = tmp_path / "t.parquet"
        assert main(["--model", str(model), "--prompts", spec, "--out", str(out)]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("capture-traces: error:"), err
        assert not out.exists() and not out.with_name(out.name + ".parts").exists()


def test_file_sources_are_recorded_by_name_and_hash(tmp_path):
    f = _jsonl(tmp_path / "mine.jsonl", [{"prompt": "x"}])
    recorded = source_name(f"jsonl:{f}@0:10")
    assert str(tmp_path) not in recorded
    assert recorded.startswith("jsonl:mine.jsonl@sha256:") and recorded.endswith("@0:10")
    assert source_name("sharegpt@0:5") == "sharegpt@0:5"


def test_data_folder_from_env_or_beside_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAP_DATA_DIR", str(tmp_path))
    assert shared_data_dir() == tmp_path
    monkeypatch.setenv("LEAP_DATA_DIR", str(tmp_path / "missing"))
    with pytest.raises(CaptureError) as err:
        load_prompts(["lmsys"])
    msg = str(err.value)
    assert "\n" not in msg and "LEAP_DATA_DIR" in msg and "../shared/data" in msg
    monkeypatch.delenv("LEAP_DATA_DIR")
    if (ROOT.parent / "shared" / "data").is_dir():
        assert shared_data_dir().resolve() == (ROOT.parent / "shared" / "data").resolve()


def test_no_absolute_data_fallback_in_the_code():
    for path in [*ROOT.glob("capture/*.py"), *ROOT.glob("simulator/*.py"), *ROOT.glob("predictors/*.py")]:
        text = path.read_text()
        for needle in ("/work/", "/root/", "/home/"):
            assert needle not in text, f"{path.relative_to(ROOT)} holds {needle!r}"
