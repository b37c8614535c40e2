"""docs/extending.md, followed: a toy policy and a toy predictor are added the way its recipes say
(the new file, the registry line, the reference-or-exempt / live decision), and the recipe's own
check commands, read from the document, are run with them. A recipe that names a file or registry
that is gone, a count of files that is wrong, or a command that fails or never lets the policy
choose, fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core.patience import scaled

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
sys.path.insert(0, str(Path(__file__).resolve().parent))

TOY_POLICY = "toy-priority"
TOY_PREDICTOR = "toy-prompt"
TOY_ROUTER = "toy-running"
#: step 1 of each recipe: the new file (the toy's code, as a user would write it)
TOY_FILES = {
    "toy_policy.py": '''
        """Priority class first (the request attribute ``priority``), then least predicted work: a toy."""
        from policies import countdown
        from policies.rule import RulePolicy

        CLASS_WIDTH = 2.0 ** 32   # one class's keys stay below the next class's (remaining < 2^32 tokens)


        def decode_key(r, t, rank):
            return t.attributes.priority[r] * CLASS_WIDTH + countdown.decode_key(r, t, rank)


        def admission_key(r, t, rank):
            return t.attributes.priority[r] * CLASS_WIDTH + countdown.admission_key(r, t, rank)


        RULES = ("decode_key", "admission_key")


        class ToyPriority(RulePolicy):
            name = "toy-priority"
            rule = __name__
            why_not = {"live": "a toy"}
        ''',
    "toy_predictor.py": '''
        """Output length = prompt length: a toy, rule-based predictor (not learned)."""
        import numpy as np

        from predictors.base import Predictor


        class ToyPrompt(Predictor):
            name = "toy-prompt"
            output = "length"
            stage = "arrival"
            static_estimates = True
            compiled = scores_at_arrival = serves_router = True

            def bind(self, workload, rng):
                super().bind(workload, rng)
                self._prompt = workload.prompt_tokens.astype(np.float64)

            def predict(self, rows, known=None):
                return self._prompt[rows]
        ''',
    "toy_router.py": '''
        """The fewest resident requests (the snapshot's ``running``): a toy."""
        from routers.base import FleetView, Router, lowest


        class FewestRunning(Router):
            name = "toy-running"
            reads = "outstanding"

            def choose(self, row: int, view: FleetView) -> int:
                return lowest(view.running)
        ''',
    # steps 2 and 3: the registry line and the live decision, made when the interpreter starts
    "sitecustomize.py": '''
        from policies import POLICIES
        from predictors import PREDICTORS
        from predictors.live import NOT_LIVE
        from routers import ALL_ROUTERS, ROUTERS
        from toy_policy import ToyPriority
        from toy_predictor import ToyPrompt
        from toy_router import FewestRunning

        POLICIES["toy-priority"] = ToyPriority
        PREDICTORS["toy-prompt"] = ToyPrompt
        ALL_ROUTERS["toy-running"] = ROUTERS["toy-running"] = FewestRunning
        NOT_LIVE["toy-prompt"] = "nothing it could use (a toy)"
        ''',
}
#: the console scripts the recipes name -> the function behind each (pyproject's [project.scripts])
SCRIPTS = {"simulate": "experiments.entry:simulate", "evaluate-predictors": "experiments.entry:evaluate_predictors"}


def section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def recipe_steps(title: str) -> list[str]:
    """The file each numbered step of a recipe touches (its first backticked path)."""
    return re.findall(r"^\d+\. `([^`]+)`", section(title), flags=re.M)


def recipe_commands(tag: str, name: str) -> list[list[str]]:
    block = re.search(rf"```sh {tag}\n(.*?)```", DOC.read_text(), flags=re.S)
    assert block, f"docs/extending.md has no ```sh {tag} block"
    return [line.replace("NAME", name).split() for line in block.group(1).splitlines() if line.strip()]


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("toys")
    for name, code in TOY_FILES.items():
        (site / name).write_text(textwrap.dedent(code))
    return site


def run_command(argv: list[str], site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1")
    if argv[0] == "pytest":
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *argv[1:]]
    else:
        module, _, func = SCRIPTS[argv[0]].partition(":")
        cmd = [sys.executable, "-c", f"import sys; from {module} import {func}; sys.argv = {argv!r}; "
               f"sys.exit({func}())"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=scaled(600))


def test_the_recipes_count_and_name_files_that_exist():
    assert recipe_steps("Add a policy") == ["policies/NAME.py", "policies/__init__.py", "tests/reference_sim.py"]
    assert "Three files" in section("Add a policy")
    assert recipe_steps("Add a predictor") == ["predictors/NAME.py", "predictors/__init__.py", "predictors/live.py"]
    assert "Three files, four with a live twin" in section("Add a predictor")
    assert recipe_steps("Add a KV victim rule") == ["policies/NAME.py", "policies/__init__.py",
                                                    "tests/reference_sim.py"]
    for title in ("Add a policy", "Add a predictor", "Add a KV victim rule"):
        for path in recipe_steps(title):
            assert (ROOT / path).parent.is_dir() and ("NAME" in path or (ROOT / path).is_file()), path
    named = {"POLICIES": "policies/__init__.py", "PREDICTORS": "predictors/__init__.py",
             "REFERENCE_EXEMPT": "tests/test_registries.py", "NOT_LIVE": "predictors/live.py",
             "LIVE_PREDICTORS": "predictors/live.py", "LIVE_CLASSES": "live/predictors.py",
             "LIVE_POLICIES": "live/config.py", "compiled_form": "policies/base.py",
             "static_estimates": "predictors/base.py", "learned": "predictors/base.py",
             "def unsupported": "simulator/compiled.py", "why_not": "policies/base.py",
             "scores_at_arrival": "predictors/base.py", "serves_router": "predictors/base.py", "learns_online": "predictors/base.py",
             "observes_prefill": "predictors/base.py", "victim_keys": "policies/base.py",
             "def victim_order": "policies/selection.py", "RUN_METRICS": "simulator/run_metrics.py",
             "class RunMetric": "simulator/run_metrics.py", "def request_latencies": "core/latency.py",
             "class RunResult": "simulator/engine.py"}
    for symbol, path in named.items():
        assert symbol.split()[-1] in DOC.read_text(), symbol
        assert symbol in (ROOT / path).read_text(), f"{symbol} is no longer in {path}"


def test_a_new_policy_must_join_the_reference_or_the_exempt_list(monkeypatch, toy_site):
    monkeypatch.syspath_prepend(str(toy_site))
    import test_registries
    from toy_policy import ToyPriority

    from policies import POLICIES
    monkeypatch.setitem(POLICIES, TOY_POLICY, ToyPriority)
    with pytest.raises(AssertionError, match=TOY_POLICY):
        test_registries.test_every_policy_is_in_the_reference_or_exempt_by_name()
    monkeypatch.setattr(test_registries, "REFERENCE_EXEMPT", test_registries.REFERENCE_EXEMPT | {TOY_POLICY})
    test_registries.test_every_policy_is_in_the_reference_or_exempt_by_name()


def test_a_new_predictor_must_make_its_live_decision(monkeypatch, toy_site):
    monkeypatch.syspath_prepend(str(toy_site))
    import test_live_registry
    from toy_predictor import ToyPrompt

    from predictors import PREDICTORS
    from predictors.live import NOT_LIVE
    monkeypatch.setitem(PREDICTORS, TOY_PREDICTOR, ToyPrompt)
    with pytest.raises(AssertionError, match="NOT_LIVE"):
        test_live_registry.test_every_simulator_predictor_is_a_twin_or_refused_live_with_a_reason()
    monkeypatch.setitem(NOT_LIVE, TOY_PREDICTOR, "a toy")
    test_live_registry.test_every_simulator_predictor_is_a_twin_or_refused_live_with_a_reason()
    assert not ToyPrompt.learned   # so it stays out of the report's tables (LEARNED)


@pytest.mark.slow
@pytest.mark.parametrize("tag, name", [("recipe-policy", TOY_POLICY), ("recipe-predictor", TOY_PREDICTOR),
                                       ("recipe-router", TOY_ROUTER)])
def test_the_recipes_commands_run_as_written(tag, name, toy_site):
    for argv in recipe_commands(tag, name):
        r = run_command(argv, toy_site)
        assert r.returncode == 0, f"{' '.join(argv)}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        if argv[0] == "pytest":
            assert re.search(r"\d+ passed", r.stdout) and "deselected" in r.stdout, r.stdout[-2000:]
        if argv[0] == "simulate":   # at the documented load the policy chooses, in the compiled kernel
            assert "never had more ready requests" not in r.stderr, r.stderr
            assert "--kernel compiled" not in r.stderr, r.stderr
        if argv[0] != "pytest" and tag != "recipe-router":
            assert name in r.stdout, r.stdout[-2000:]


def test_the_toy_policy_serves_by_priority_class_on_both_kernels_alike(monkeypatch, toy_site):
    """The toy's rule, written once, is what both engines run: the compiled kernel (no fallback)
    replays the reference byte for byte, and the trace's ``priority`` column reaches the rule."""
    import dataclasses

    import numpy as np
    import pyarrow as pa

    from core.trace import trace_from_arrays
    from predictors import make_predictor
    from simulator.compiled import unsupported
    from simulator.engine import EngineConfig, Simulation
    from simulator.profiles.unit import UnitProfile
    from simulator.runner import run_simulation

    pytest.importorskip("numba")
    monkeypatch.syspath_prepend(str(toy_site))
    from toy_policy import ToyPriority

    n = 40
    rng = np.random.default_rng(3)
    output = rng.integers(2, 30, n)
    trace = trace_from_arrays("toy", np.full(n, 8), output)
    priority = np.where(np.arange(n) % 2 == 0, 1, 0)   # odd rows are the urgent class
    trace = dataclasses.replace(trace, table=trace.table.append_column("priority", pa.array(priority, pa.int64())))
    runs = {}
    for kernel in ("reference", "compiled"):
        oracle = make_predictor("oracle")
        sim = Simulation(trace, np.zeros(n), policy=ToyPriority(), predictor=oracle, profile=UnitProfile(),
                         config=EngineConfig(max_resident=n, decode_slots=4, wait_cap=0))
        assert unsupported(sim) is None
        runs[kernel] = run_simulation(sim, kernel)
    ref, comp = runs["reference"], runs["compiled"]
    assert ref.finish_s.tobytes() == comp.finish_s.tobytes()
    urgent, other = ref.finish_s[priority == 0], ref.finish_s[priority == 1]
    assert urgent.mean() < other.mean() and np.median(urgent) < np.median(other)   # served first


def test_the_toy_router_reads_the_snapshots_running_counter(monkeypatch, toy_site):
    """The router recipe's toy, on a hand example: replica 0 holds 2 requests (1 resident), replica 1
    holds 3 (none resident): fewest outstanding would pick 0, fewest resident picks 1; once replica
    1 has 2 resident it picks 0. The signals the recipe's table names exist where it says."""
    import dataclasses

    from routers.base import FleetView
    from routers.snapshot import ReplicaAccounting, WorkSum

    monkeypatch.syspath_prepend(str(toy_site))
    from toy_router import FewestRunning

    acc = ReplicaAccounting(2)
    for replica in (0, 0, 1, 1, 1):
        acc.route(replica, WorkSum(5))
    acc.set_running(0, 1)
    router = FewestRunning()
    router.reset(2, 0)
    assert router.choose(0, acc.view(router.reads)) == 1
    acc.set_running(1, 2)
    assert router.choose(1, acc.view(router.reads)) == 0
    acc.set_running(0, 2)
    assert router.choose(2, acc.view(router.reads)) == 0       # a tie goes to the lowest index
    fields = {f.name for f in dataclasses.fields(FleetView)}
    table = re.findall(r"^\| `\"(\w+)\"` \| (.*?) \|", section("Add a router"), flags=re.M)
    assert [reads for reads, _ in table] == ["outstanding", "predicted_work", "true_work", "kv"]
    for reads, named in table:
        filled = {k for k, v in dataclasses.asdict(ReplicaAccounting(2, 4).view(reads)).items() if v is not None}
        assert set(re.findall(r"`(\w+)`", named)) == filled - {"replicas", "block_size", "now", "snapshot_at"}, reads
        assert set(re.findall(r"`(\w+)`", named)) <= fields


def recipe_code(tag: str) -> str:
    """A recipe's code block, as the page shows it (```python TAG)."""
    block = re.search(rf"```python {tag}\n(.*?)```", DOC.read_text(), flags=re.S)
    assert block, f"docs/extending.md has no ```python {tag} block"
    return block.group(1)


def recipe_namespace(tag: str) -> dict:
    namespace: dict = {"__name__": f"recipe_{tag.replace('-', '_')}"}
    exec(compile(recipe_code(tag), f"docs/extending.md ({tag})", "exec"), namespace)
    return namespace


def victim_policy() -> type:
    from policies.base import Policy
    return next(v for v in recipe_namespace("recipe-victim").values()
                if isinstance(v, type) and issubclass(v, Policy) and "victim_keys" in vars(v))


@pytest.fixture(scope="module")
def recipe_site(tmp_path_factory) -> Path:
    """The KV victim and metric recipes' code, from the page, registered when the interpreter starts."""
    site = tmp_path_factory.mktemp("recipes")
    (site / "recipe_victim.py").write_text(recipe_code("recipe-victim"))
    (site / "recipe_metric.py").write_text(recipe_code("recipe-metric"))
    (site / "sitecustomize.py").write_text(
        "import recipe_metric  # noqa: F401 (registers its metric)\nfrom policies import POLICIES\n"
        "from policies.base import Policy\nimport recipe_victim\n"
        "for v in vars(recipe_victim).values():\n"
        "    if isinstance(v, type) and issubclass(v, Policy) and 'victim_keys' in vars(v):\n"
        "        POLICIES[v.name] = v\n")
    return site


def test_the_victim_recipes_rule_orders_a_hand_example():
    """Four residents (prompt 4 each; generated 9, 1, 5, 3 tokens; estimates 20, 30, 6, 40), row 0
    decodes: countdown spares by remaining length (1, 11, 29, 37: rows 2, 0, 1, 3), so row 3 goes
    first; the recipe's rule spares by tokens held (13, 9, 7, 5: rows 0, 2, 3, 1), so row 1 goes first,
    and the decode stays in front either way."""
    import numpy as np

    from policies import make_policy
    from policies.base import SchedulerView
    from policies.selection import victim_order

    view = SchedulerView(now=0.0, arrival_s=np.zeros(4), predicted=np.array([20.0, 30.0, 6.0, 40.0]),
                         generated=np.array([9, 1, 5, 3]), output_kind="length", prompt=np.full(4, 4))
    rows, chosen = np.arange(4), np.array([0])
    assert victim_order(make_policy("countdown"), view, rows, chosen, 0).tolist() == [0, 2, 1, 3]
    toy = victim_policy()()
    assert victim_order(toy, view, rows, chosen, 0).tolist() == [0, 2, 3, 1]
    assert victim_order(toy, view, rows, np.array([1, 3]), 1).tolist() == [1, 3, 0, 2]   # forced first
    assert toy.decode_keys(view, rows).tolist() == make_policy("countdown").decode_keys(view, rows).tolist()


def test_a_policy_with_its_own_victim_rule_is_declared_off_the_kernel_with_kv_blocks():
    """The kernel preempts in the decode order: the recipe's class is declared off it when defined,
    and a KV-bound run of it names why it falls back, while countdown's runs compiled."""
    from types import SimpleNamespace

    pytest.importorskip("numba")
    from policies import make_policy
    from simulator.compiled import unsupported
    from simulator.profiles import make_profile

    toy = victim_policy()()
    assert toy.kernel_victims is False and make_policy("countdown").kernel_victims is True

    def sim(policy, kv):
        config = SimpleNamespace(kv_bounded=kv, caches_prefixes=False)
        return SimpleNamespace(config=config, policy=policy, predictor=None, profile=make_profile("unit"))
    assert "victim_keys" in unsupported(sim(toy, True))
    assert unsupported(sim(toy, False)) is None and unsupported(sim(make_policy("countdown"), True)) is None


def test_the_metric_recipes_figure_on_a_hand_example(monkeypatch):
    """Six requests at t=0 on the unit engine (every step 1 s), one resident at a time: the last one
    waits for the five before it, so the slowest first token is its, and the summary, the JSON and
    the wide table's columns carry the recipe's entry."""
    import numpy as np

    from core.trace import trace_from_arrays
    from policies import make_policy
    from simulator import run_metrics
    from simulator.engine import EngineConfig, Simulation
    from simulator.metrics import summarize
    from simulator.profiles.unit import UnitProfile

    monkeypatch.setattr(run_metrics, "RUN_METRICS", dict(run_metrics.RUN_METRICS))
    namespace = recipe_namespace("recipe-metric")
    added = set(run_metrics.RUN_METRICS) - {"p99_ptl_s"}
    assert len(added) == 1 and namespace["RUN_METRICS"] is run_metrics.RUN_METRICS
    key = added.pop()
    n, output = 6, np.array([3, 1, 4, 1, 5, 2])
    sim = Simulation(trace_from_arrays("toy", np.full(n, 8), output), np.zeros(n), policy=make_policy("fcfs"),
                     predictor=None, profile=UnitProfile(), config=EngineConfig(max_resident=1, decode_slots=1,
                                                                               wait_cap=0))
    result = sim.run()
    ttft = result.first_token_s - result.arrival_s
    summary = summarize(result)
    assert summary[key] == float(ttft.max()) > float(np.mean(ttft))
    assert summary[key] == float(ttft[-1])
    assert (run_metrics.RUN_METRICS[key].header, key) in run_metrics.wide_columns()


@pytest.mark.slow
def test_the_victim_and_metric_recipes_commands_run_as_written(recipe_site):
    import json

    victim = victim_policy().name
    for argv in recipe_commands("recipe-victim", victim):
        r = run_command(argv, recipe_site)
        assert r.returncode == 0, f"{' '.join(argv)}: exit {r.returncode}\n{r.stderr[-3000:]}"
        runs = {s["policy"]: s for s in map(json.loads, r.stdout.splitlines())}
        assert set(runs) == {victim, "countdown"} and runs[victim]["preemptions"] > 0
        assert (runs[victim]["preemptions"], runs[victim]["mean_e2e_s"]) != (
            runs["countdown"]["preemptions"], runs["countdown"]["mean_e2e_s"])   # the rule chose
    header = re.search(r'RunMetric\("([^"]+)"', recipe_code("recipe-metric")).group(1)
    key = re.search(r'RUN_METRICS\["(\w+)"\]', recipe_code("recipe-metric")).group(1)
    wide, as_json = recipe_commands("recipe-metric", "")
    r = run_command(wide, recipe_site)
    assert r.returncode == 0 and header in r.stdout and "p99 NL" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    r = run_command(as_json, recipe_site)
    assert r.returncode == 0, r.stderr[-2000:]
    assert all(isinstance(json.loads(line)[key], float) for line in r.stdout.splitlines())
