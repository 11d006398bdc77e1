"""What a user reads about a divergence or a re-plan names only what is known: a plan
every node shares, or a stop heard from another rank, has no node, index or round to
give, and the message must not print -1 for them."""

from __future__ import annotations

from pathlib import Path

import pytest

import engine
from engine._asyncfor.guard import Violation
from replay._ttcmds import _writer

PROGRAM = """
import engine as ap


def train():
    X = ap.dvector(8, shape=(), init=ap.init.zeros(), name="X")
    for epoch in range(2):

        def body(j):
            X[j] = X[j] + 1.0

        ap.async_for(0, 6, body, name="{name}")
    ap.log_objective("total", float(X.gather().sum()))
"""

UNKNOWN = ("node -1", "index -1", "round -1", "thread -1")


def test_a_renamed_operator_diverges_at_the_plan_without_a_node(tmp_path: Path, cli) -> None:
    app = tmp_path / "train.py"
    app.write_text(PROGRAM.format(name="add"))
    trace = tmp_path / "t.sqlite"
    assert cli("run", f"{app}:train", "--trace", trace, "--ranks", "1").returncode == 0
    app.write_text(PROGRAM.format(name="plus"))
    proc = cli("single", trace, "--allow-changed-code")
    assert proc.returncode == 3, proc.stderr
    assert "DIVERGED at plus#0, plan: the trace expected no operator of this name" in proc.stdout
    assert not any(u in proc.stdout + proc.stderr for u in UNKNOWN), proc.stdout


@pytest.mark.parametrize(
    ("node", "what", "event", "head"),
    [
        (-1, "plan", "plan", "replay diverged at sgd#3, plan: "),
        (-1, "plan", 2, "replay diverged at sgd#3, plan 2: "),
        (1, "lock", "round 2", "replay diverged on node 1 at sgd#3, lock round 2: "),
        (0, "outcome", "outcome digest of W", "replay diverged on node 0 at sgd#3, outcome "),
        (-1, "objective", "rmse", "replay diverged at objective rmse, iteration 3: "),
    ],
)
def test_the_error_names_the_node_only_when_one_is_to_blame(
    node: int, what: str, event: object, head: str
) -> None:
    exc = engine.DivergenceError(
        node=node,
        op="objective" if what == "objective" else "sgd",
        invocation=3,
        event=event,
        what=what,
        expected="4 rounds",
        actual="5",
    )
    assert str(exc).startswith(head), str(exc)
    assert "node -1" not in str(exc) and f"{what} {what}" not in str(exc)


def test_a_stop_heard_from_another_rank_names_no_index_node_or_element() -> None:
    v = Violation("sgd", 4, -1, -1, "-", False, "another node left the plan")
    msg = v.message()
    assert msg.startswith("async_for 'sgd' invocation 4: another node left the plan")
    assert not any(u in msg for u in UNKNOWN) and " read -" not in msg
    known = Violation("sgd", 4, 17, 1, "W[3]", True, "is outside its write set", 2)
    assert "index 17 on node 1 wrote W[3]" in known.message()


def test_history_leaves_out_a_thread_and_round_the_plan_does_not_know() -> None:
    w = {"index": 9, "node": 1, "thread": -1, "round": -1}
    assert _writer(w) == "last written by index 9 on node 1"
    w.update(thread=0, round=2)
    assert _writer(w) == "last written by index 9 on node 1, thread 0, round 2"


def test_a_changed_objective_names_the_objective_and_iteration(tmp_path: Path, cli) -> None:
    app = tmp_path / "train.py"
    program = PROGRAM.replace('ap.log_objective("total", float(X.gather().sum()))', "{log}")
    app.write_text(program.format(name="add", log='ap.log_objective("total", 6.0)'))
    trace = tmp_path / "t.sqlite"
    assert cli("run", f"{app}:train", "--trace", trace).returncode == 0
    app.write_text(program.format(name="add", log='ap.log_objective("total", 6.5)'))
    proc = cli("single", trace, "--allow-changed-code")
    assert proc.returncode == 3, proc.stderr
    assert (
        "DIVERGED at objective total, iteration 0: the trace expected 6.0, the program did 6.5"
        in proc.stdout
    ), proc.stdout
