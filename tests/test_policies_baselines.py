"""The prediction-free baselines (hrrn, mlfq, boost, priority, edf): their keys by hand, their
properties, their settings' refusals (one line, exit 2) and ``--policy all`` on the command line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.attributes import Attributes
from experiments.cli import main
from policies import POLICIES, make_policy
from policies.base import SchedulerView
from policies.selection import rank

TRACE = "sharegpt-lengths"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def view(prompt, generated, arrival=None, predicted=None, now=0.0, priority=None, kind="length"):
    n = len(prompt)
    return SchedulerView(now=now, arrival_s=np.asarray(arrival if arrival is not None else np.zeros(n), float),
                         predicted=np.asarray(predicted if predicted is not None else np.zeros(n), float),
                         generated=np.asarray(generated, np.int64), output_kind=kind,
                         attributes=Attributes(np.asarray(priority if priority is not None else np.zeros(n), np.int64)),
                         prompt=np.asarray(prompt, np.int64))


def keys(policy, v):
    return policy.decode_keys(v, np.arange(len(v.generated))).tolist()


# ----------------------------------------------------------------------------- by hand
def test_mlfq_queues_by_hand():
    """quantum 16, entry 256: prompts 100, 257, 600, 5000 enter queues 0, 1, 2, 5 (6 queues: the last
    is 5). Entering at 0 a row stays 16 tokens (0-15), then 32 in queue 1 (16-47), 64 in queue 2
    (48-111); entering at 1 it stays 32 tokens (0-31) before queue 2."""
    mlfq = make_policy("mlfq")
    assert keys(mlfq, view([100, 257, 600, 5000], [0, 0, 0, 0])) == [0, 1, 2, 5]
    assert keys(mlfq, view([100] * 6, [15, 16, 47, 48, 111, 112])) == [0, 1, 1, 2, 2, 3]
    assert keys(mlfq, view([300, 300, 300], [31, 32, 10**6])) == [1, 2, 5]
    two = make_policy("mlfq", [("levels", 2), ("quantum", 1), ("entry_tokens", 1)])
    assert keys(two, view([1, 2, 1], [0, 0, 5])) == [0, 1, 1]


def test_boost_keys_by_hand():
    """key = arrival - (1/gamma) ln(1 / (1 - exp(-gamma token_s size))); gamma 0.5, token_s 1: a
    prompt of 2 tokens (no estimate) at t = 3: 3 - 2 ln(1 / (1 - e^-1)) = 3 - 0.91733; the estimate
    10 with 7 generated is 3 tokens left."""
    boost = make_policy("boost", [("gamma", 0.5), ("token_s", 1.0)])
    got = keys(boost, view([2, 50], [0, 7], arrival=[3.0, 3.0], predicted=[0.0, 10.0]))
    assert got[0] == pytest.approx(3 - 2 * math.log(1 / (1 - math.exp(-1.0))), abs=1e-12)
    assert got[1] == pytest.approx(3 - 2 * math.log(1 / (1 - math.exp(-1.5))), abs=1e-12)


def test_boost_spans_fcfs_to_shortest_first():
    """Large gamma: arrival order; small gamma: size order, whatever the arrivals."""
    v = view([400, 10, 100], [0, 0, 0], arrival=[0.0, 1.0, 2.0])
    fcfs = make_policy("boost", [("gamma", 1000.0)])
    sjf = make_policy("boost", [("gamma", 1e-6)])
    assert rank(fcfs, v, np.arange(3), 3).tolist() == [0, 1, 2]
    assert rank(sjf, v, np.arange(3), 3).tolist() == [1, 2, 0]


def test_priority_orders_by_class_then_arrival():
    v = view([5] * 4, [1] * 4, arrival=[0.0, 1.0, 2.0, 3.0], priority=[1, 0, 1, -1])
    assert rank(make_policy("priority"), v, np.arange(4), 4).tolist() == [3, 1, 0, 2]


def test_edf_deadlines_by_hand():
    """ttft 1000 ms, tpot 100 ms: row 0 (t=0, 10 tokens out) is due at 0 + 1 + 10 x 0.1 = 2.0;
    row 1 (t=1.5, 1 out) at 2.6; with e2el 2500 ms as well, row 1's end (4.0) is later, row 0's
    (2.5) too: the token deadlines stand; e2el alone: arrival + 2.5."""
    v = view([5, 5], [10, 1], arrival=[0.0, 1.5])
    assert keys(make_policy("edf", slos=(("ttft", 1000.0), ("tpot", 100.0))), v) == pytest.approx([2.0, 2.6])
    both = make_policy("edf", slos=(("ttft", 1000.0), ("tpot", 100.0), ("e2el", 2500.0)))
    assert keys(both, v) == pytest.approx([2.0, 2.6])
    assert keys(make_policy("edf", slos=(("e2el", 2500.0),)), v) == pytest.approx([2.5, 4.0])
    tight = make_policy("edf", slos=(("ttft", 1000.0), ("tpot", 100.0), ("e2el", 1500.0)))
    assert keys(tight, v) == pytest.approx([1.5, 2.6])


def test_hrrn_ratio_by_hand():
    """token_s 0.5, now 10: row 0 (prompt 4, arrived at 8: wait 4 tokens) ratio (4 + 4) / 4 = 2;
    row 1 (prompt 20, arrived at 0: wait 20) (20 + 20) / 20 = 2: a tie, broken by row; row 2 with an
    estimate of 5 tokens, arrived at 9: (2 + 5) / 5 = 1.4."""
    hrrn = make_policy("hrrn", [("token_s", 0.5)])
    v = view([4, 20, 100], [1, 1, 1], arrival=[8.0, 0.0, 9.0], predicted=[0.0, 0.0, 5.0], now=10.0)
    assert keys(hrrn, v) == pytest.approx([-2.0, -2.0, -1.4])
    assert rank(hrrn, v, np.arange(3), 3).tolist() == [0, 1, 2]


# ----------------------------------------------------------------------------- properties
@settings(max_examples=200, deadline=None, derandomize=True)
@given(prompt=st.integers(1, 20000), g=st.integers(0, 5000), quantum=st.integers(1, 64), levels=st.integers(1, 8))
def test_mlfq_never_promotes_and_stays_in_range(prompt, g, quantum, levels):
    mlfq = make_policy("mlfq", [("quantum", quantum), ("levels", levels)])
    now, after = keys(mlfq, view([prompt, prompt], [g, g + 1]))
    assert 0 <= now <= after <= levels - 1


@settings(max_examples=200, deadline=None, derandomize=True)
@given(a=st.integers(1, 5000), b=st.integers(1, 5000), gamma=st.floats(1e-4, 10.0), arrival=st.floats(0, 100))
def test_boost_prefers_the_smaller_of_two_same_time_requests(a, b, gamma, arrival):
    boost = make_policy("boost", [("gamma", gamma)])
    ka, kb = keys(boost, view([a, b], [0, 0], arrival=[arrival, arrival]))
    assert (ka <= kb) == (a <= b) or ka == kb


@settings(max_examples=100, deadline=None, derandomize=True)
@given(gen=st.lists(st.integers(0, 300), min_size=2, max_size=6))
def test_edf_deadline_rises_with_each_token(gen):
    edf = make_policy("edf", slos=(("ttft", 500.0), ("tpot", 50.0)))
    before = keys(edf, view([3] * len(gen), gen))
    after = keys(edf, view([3] * len(gen), [x + 1 for x in gen]))
    assert all(b > a for a, b in zip(before, after))


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "boost", "--setting", "boost.gamma=0"], "--setting boost.gamma='0': must be > 0"),
    (["--policy", "boost", "--setting", "boost.gamma=-1"], "must be > 0"),
    (["--policy", "mlfq", "--setting", "mlfq.quantum=0"], "--setting mlfq.quantum='0': must be > 0"),
    (["--policy", "mlfq", "--setting", "mlfq.quantum=abc"], "expected a whole number"),
    (["--policy", "mlfq", "--setting", "mlfq.levels=1.5"], "expected a whole number"),
    (["--policy", "boost", "--setting", "boost.gamma=fast"], "expected a number"),
    (["--policy", "boost", "--setting", "boost.speed=1"], "has no setting 'speed'"),
    (["--policy", "edf"], "--slo"),
])
def test_bad_policy_input_is_one_line_exit_2(capsys, args, message):
    assert main(["--trace", TRACE, "--requests", "20", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_a_config_with_a_wrong_type_is_refused_in_one_line(tmp_path, capsys):
    assert main(["--trace", TRACE, "--requests", "30", "--predictor", "none", "--policy", "boost",
                 "--setting", "boost.gamma=0.2",
                 "--out", str(tmp_path / "run")]) == 0
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert record["policy_options"] == {"gamma": 0.2}
    assert record["policy_settings"]["gamma"] == 0.2
    capsys.readouterr()
    record["policy_options"] = {"gamma": "high"}
    (tmp_path / "bad.json").write_text(json.dumps(record))
    assert main(["--config", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "boost.gamma='high'" in err, err


# ----------------------------------------------------------------------------- the command line
def test_policy_all_runs_every_policy_beside_countdown_and_aging(capsys):
    assert main(["--trace", TRACE, "--json", "--requests", "200", "--load", "1.5x", "--policy", "all",
                 "--predictor", "none,oracle", "--slo", "ttft:2000", "tpot:100"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    ran = {(s["predictor"], s["policy"]) for s in lines}
    assert {("oracle", p) for p in POLICIES} <= ran
    assert {("none", p) for p, c in POLICIES.items() if not c.uses_predictions} <= ran
    assert ("none", "countdown") not in ran   # needs a predictor: beside one, `none` is the FCFS baseline


def test_slack_countdown_by_hand():
    """horizon 10 s, token_s 1 s, now 5: row 0 (arrived 0, 3 tokens left: slack 10 - 5 - 3 = 2) is keyed
    by countdown (3); row 1 (arrived 0, 8 left: slack -3) and row 2 (arrived 1, 7 left: slack -1) are
    urgent, by deadline (10, then 11); row 3 (arrived 4, 1 left) by countdown (1)."""
    slack = make_policy("slack-countdown", [("horizon_s", 10.0), ("token_s", 1.0)])
    v = view([5] * 4, [2, 2, 3, 1], arrival=[0.0, 0.0, 1.0, 4.0], predicted=[5.0, 10.0, 10.0, 2.0], now=5.0)
    got = keys(slack, v)
    assert got[0] == 3.0 and got[3] == 1.0 and got[1] < got[2] < 0
    assert rank(slack, v, np.arange(4), 4).tolist() == [1, 2, 3, 0]
    v.now = 1.0   # nobody's slack is spent yet: countdown's order
    assert rank(slack, v, np.arange(4), 4).tolist() == [3, 0, 2, 1]


@settings(max_examples=100, deadline=None, derandomize=True)
@given(left=st.lists(st.integers(1, 500), min_size=2, max_size=8), horizon=st.floats(1.0, 1e6))
def test_slack_countdown_is_countdown_while_no_slack_is_spent(left, horizon):
    """At time 0 with a horizon beyond every request's remaining work: the same order as countdown."""
    n = len(left)
    v = view([5] * n, [0] * n, predicted=left)
    slack = make_policy("slack-countdown", [("horizon_s", horizon), ("token_s", horizon / 1000.0)])
    assert rank(slack, v, np.arange(n), n).tolist() == rank(make_policy("countdown"), v, np.arange(n), n).tolist()


def test_slack_mlfq_by_hand():
    """horizon 10 s, token_s 1 s, now 1 (nobody urgent): MLFQ's queue first (quantum 16: 20 tokens out
    is queue 1), then the predicted remaining (8 - 2 = 6 before 9.5 - 2 = 7.5); row 3 (arrived at -6,
    4 left: slack 10 - 6 - 1 - 4 < 0) is urgent and goes first."""
    slack = make_policy("slack-mlfq", [("horizon_s", 10.0), ("token_s", 1.0)])
    v = view([5] * 4, [20, 2, 2, 1], arrival=[0.0, 0.0, 0.0, -6.0], predicted=[25.0, 9.5, 8.0, 5.0], now=1.0)
    got = keys(slack, v)
    assert got[:3] == [1e6 + 5.0, 7.5, 6.0] and got[3] < 0
    assert rank(slack, v, np.arange(4), 4).tolist() == [3, 2, 1, 0]


def test_policy_all_without_slos_leaves_edf_out_with_a_note(capsys):
    assert main(["--trace", TRACE, "--json", "--requests", "60", "--load", "1.5x", "--policy", "all",
                 "--predictor", "none"]) == 0
    out, err = capsys.readouterr()
    ran = {json.loads(x)["policy"] for x in out.splitlines() if x.strip()}
    assert ran == {p for p, c in POLICIES.items() if not c.uses_predictions and not c.needs_slo}
    assert "--policy all leaves out edf (it needs --slo)" in err
