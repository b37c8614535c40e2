"""``--setting POLICY.KEY=VALUE`` (a policy's own settings, beside the predictors'), ``--policy all``,
and the check that every planned run's policy can be built (bad settings, ``edf`` without ``--slo``)
before anything runs: one line, exit 2 (``core.errors.UsageError``)."""

from __future__ import annotations

import sys

from core.errors import UsageError
from policies import POLICIES, make_policy
from policies.settings import typed_settings


def expand_policies(names: list[str], slo_given: bool) -> list[str | None]:
    """``all`` = every registered policy, in registry order (duplicates dropped), less those built
    from SLOs (``edf``) when the run has none (a note says so; named alone they are refused)."""
    out: list[str | None] = []
    for name in names:
        if name != "all":
            out.append(name)
            continue
        left_out = [p for p, cls in POLICIES.items() if cls.needs_slo and not slo_given]
        if left_out:
            print(f"simulate: note: --policy all leaves out {', '.join(left_out)} (it needs --slo)", file=sys.stderr)
        out += [p for p in POLICIES if p not in left_out]
    return list(dict.fromkeys(out))


def split_settings(items: list[str]) -> tuple[list[str], dict[str, tuple[tuple[str, object], ...]]]:
    """``--setting`` entries: those naming a policy typed and checked here, as {policy: ((key, value), ...)};
    the rest (the predictors') returned as they are."""
    rest: list[str] = []
    given: dict[str, dict[str, str]] = {}
    for item in items:
        name = item.partition("=")[0].strip().partition(".")[0]
        if name in POLICIES and "=" in item and "." in item.partition("=")[0]:
            key, _, value = item.partition("=")[0].strip().partition(".")[2], None, item.partition("=")[2].strip()
            given.setdefault(name, {})[key] = value
        else:
            rest.append(item)
    options = {}
    for name, values in given.items():
        try:
            typed = typed_settings(POLICIES[name], values.items())
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        options[name] = tuple(sorted(typed.items()))
    return rest, options


def check_policies(configs: list) -> None:
    """Every run's policy built once from its settings and SLOs; a refusal is the command's one line."""
    seen = set()
    for config in configs:
        key = (config.policy, config.policy_options, config.goodput)
        if key in seen:
            continue
        seen.add(key)
        try:
            make_policy(config.policy, config.policy_options, config.goodput)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
