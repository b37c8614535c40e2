"""No module of the live side (``live/``, ``leap_sched/``) branches on a predictor's or a policy's
name: what a predictor or policy can do is declared on its class (``live``, ``live_hook``,
``live_prompt_text``, ``uses_predictions``, ``router_estimate()`` ...) and read from there, so a new
one needs no edit in these modules. An AST scan: a comparison (``==``, ``!=``, ``in``) of anything
with a registered name as a string literal fails, naming the file and line."""

from __future__ import annotations

import ast
from pathlib import Path

from policies import POLICIES
from predictors import NO_PREDICTOR, PREDICTORS
from predictors.live import LIVE_PREDICTORS

ROOT = Path(__file__).resolve().parents[1]
NAMES = set(PREDICTORS) | set(LIVE_PREDICTORS) | set(POLICIES) | {NO_PREDICTOR}
#: vLLM's own names that happen to spell one of ours: (file, the compared expression's source)
VLLM_OWN = {("leap_sched/vllm/settings.py", "vllm_config.scheduler_config.policy")}


def _literals(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _literals(e)]
    return []


def name_branches(source: str, path: str) -> list[str]:
    """``path:line: source`` of each comparison against a registered predictor or policy name."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = [s for side in sides for s in _literals(side) if s in NAMES]
        others = {ast.unparse(side) for side in sides if not _literals(side)}
        if named and not any((path, o) in VLLM_OWN for o in others):
            out.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_live_module_branches_on_a_predictor_or_policy_name():
    found = [hit for package in ("live", "leap_sched") for f in sorted((ROOT / package).rglob("*.py"))
             for hit in name_branches(f.read_text(), str(f.relative_to(ROOT)))]
    assert not found, "branches on a name (declare it on the class):\n" + "\n".join(found)


def test_the_scan_finds_a_planted_branch():
    planted = 'if args.predictor == "ssjf":\n    pass\nok = cfg.predictor in ("leap", "x")\nfine = a == "b"\n'
    assert name_branches(planted, "live/x.py") == ["live/x.py:1: args.predictor == 'ssjf'",
                                                   "live/x.py:3: cfg.predictor in ('leap', 'x')"]
