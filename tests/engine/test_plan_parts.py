"""A node keeps its own part of a plan once it has run it (issue 35, item 3).

The class of failure: something that runs later under a reused plan reads another node's
tasks, which a rank no longer holds, and silently sees "no tasks" (a wrong body count, a
wrong serial order, a replay that compares nothing and says the plan is the one recorded).
So: a kept part equals the whole plan's part for the nodes kept and is empty elsewhere;
what the rest of the run reads of the others (body counts, the digest) is the whole plan's;
what needs every node's tasks refuses a partial plan; and a replay that holds only its own
nodes' tasks still catches a recorded plan that differs on any node.
"""

from __future__ import annotations

import pickle
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap
from engine import DivergenceError
from engine._machines.planner import Plan, Task, make_plan
from engine._machines.planparts import keep_nodes, node_bytes, own_parts, plan_digest, whole_plan
from replay._controller import TraceController
from tests.tracer.test_trace_plans import random_sets

plans = st.builds(
    lambda n, m, seed, start, nodes, threads, strategy: make_plan(
        random_sets(n, m, seed, start), nodes, threads, strategy=strategy
    ),
    n=st.integers(1, 120),
    m=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    start=st.integers(0, 50),
    nodes=st.integers(2, 5),
    threads=st.integers(1, 3),
    strategy=st.sampled_from(["auto", "components", "colouring"]),
)


def _shape(plan: Plan, node: int) -> list[list[tuple[int, bool, list[int]]]]:
    return [
        [(t.thread, bool(t.locked), t.indices.tolist()) for t in rnd[node]] for rnd in plan.rounds
    ]


def _edits(plan: Plan) -> list[tuple[str, Plan]]:
    """Plans that differ from ``plan`` in one task of one node, one way each."""
    out = []
    for r, rnd in enumerate(plan.rounds):
        for q, tasks in enumerate(rnd):
            for k, t in enumerate(tasks):

                def edited(task: Task, r: int = r, q: int = q, k: int = k) -> Plan:
                    rounds = [[list(ts) for ts in per] for per in plan.rounds]
                    rounds[r][q][k] = task
                    return replace(plan, rounds=rounds)

                out.append((f"thread r{r} n{q}", edited(Task(t.thread + 1, t.indices, t.locked))))
                out.append((f"lock r{r} n{q}", edited(Task(t.thread, t.indices, not t.locked))))
                if len(t.indices) > 1:
                    out.append(
                        (
                            f"order r{r} n{q}",
                            edited(Task(t.thread, t.indices[::-1].copy(), t.locked)),
                        )
                    )
                out.append((f"index r{r} n{q}", edited(Task(t.thread, t.indices + 1, t.locked))))
                return out  # the first task found: enough per plan, hypothesis varies it
    return out


@settings(max_examples=40, deadline=None)
@given(plan=plans, data=st.data())
def test_a_kept_part_is_the_whole_plans_part_and_keeps_its_figures(plan: Plan, data: Any) -> None:
    nodes = data.draw(st.sets(st.integers(0, plan.nodes - 1), min_size=1))
    part = keep_nodes(plan, nodes)
    assert part.kept == tuple(sorted(nodes))
    assert part.partial == (len(nodes) < plan.nodes)
    assert len(part.rounds) == len(plan.rounds)
    for q in range(plan.nodes):
        if q in nodes:
            assert _shape(part, q) == _shape(plan, q)
            assert all(
                np.array_equal(a[q], b[q]) for a, b in zip(part.writes, plan.writes, strict=True)
            )
        else:  # another node's part is not there, and reading it says so
            for rnd in [*part.rounds, *part.writes]:
                with pytest.raises(ValueError, match=f"node {q}'s tasks: this plan holds only"):
                    rnd[q]
    assert part.bodies_per_node().tolist() == plan.bodies_per_node().tolist()
    assert plan_digest(part) == plan_digest(plan)
    assert part.loads is None  # the planner's per-round loads are not kept
    # keeping fewer of a part's nodes again is allowed; getting back a dropped one is not
    again = keep_nodes(part, [min(nodes)])
    assert plan_digest(again) == plan_digest(plan)
    dropped = set(range(plan.nodes)) - nodes
    if dropped:
        with pytest.raises(ValueError, match="plan holds node"):
            keep_nodes(part, [min(dropped)])
        with pytest.raises(ValueError, match="needs every node's tasks"):
            part.serial_order()
        with pytest.raises(ValueError, match="needs every node's tasks"):
            part.has_locks()
        with pytest.raises(ValueError, match="every node's tasks: this plan holds only"):
            list(part.rounds[0])
        with pytest.raises(ValueError, match="a copy of every node's tasks"):
            pickle.dumps(part.rounds[0])
        q = min(nodes)  # what the benchmark counts: this node's part and the figures
        own = sum(t.indices.nbytes for rnd in plan.rounds for t in rnd[q])
        own += sum(w[q].nbytes for w in plan.writes)
        extra = 0 if plan.order is None else plan.order.nbytes
        assert node_bytes(part, q) == own + 8 * plan.nodes + 32 + extra
    else:
        assert np.array_equal(part.serial_order(), plan.serial_order())
        assert part.has_locks() == plan.has_locks()
    # the parts every process holds make the whole plan again (``ap.plan_of`` under MPI)
    shares = [keep_nodes(plan, [q]) for q in range(plan.nodes)]
    back = whole_plan(shares[0], [own_parts(p) for p in shares])
    assert [_shape(back, q) for q in range(plan.nodes)] == [
        _shape(plan, q) for q in range(plan.nodes)
    ]
    assert back.kept is None and plan_digest(back) == plan_digest(plan)
    with pytest.raises(RuntimeError, match="do not make the plan"):
        whole_plan(shares[0], [own_parts(p) for p in shares[1:]])  # a node's part missing


@settings(max_examples=40, deadline=None)
@given(plan=plans)
def test_the_digest_tells_apart_plans_that_differ_in_any_task(plan: Plan) -> None:
    base = plan_digest(plan)
    for what, other in _edits(plan):
        assert plan_digest(other) != base, what


class _Run:
    """The parts of a recorded run ``TraceController.check_plan`` reads."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self.info = SimpleNamespace(status="finished", ranks=1)

    def digest_kind(self) -> str:
        return "xxh3"

    def plan_starts(self, op: str) -> list[int]:
        return [0]

    def plan(self, op: str, invocation: int) -> Plan:
        return self._plan


@settings(max_examples=30, deadline=None)
@given(plan=plans, data=st.data())
def test_a_replay_holding_its_own_nodes_still_catches_a_plan_that_differs_anywhere(
    plan: Plan, data: Any
) -> None:
    """The replay's plan holds node ``mine`` only (as an MPI rank's does after the first
    invocation); the recorded plan differs in one task of some node: caught, in one line
    naming the node when it is this rank's, by the digest when it is another's."""
    mine = data.draw(st.integers(0, plan.nodes - 1))
    ctl = TraceController(_Run(plan), single=False)
    ctl.check_plan("op", 3, keep_nodes(plan, [mine]))  # the same plan: no divergence
    for what, recorded in _edits(plan):
        ctl = TraceController(_Run(recorded), single=False)
        with pytest.raises(DivergenceError) as err:
            ctl.check_plan("op", 3, keep_nodes(plan, [mine]))
        text = str(err.value)
        node = int(what.split(" n")[1])
        if node == mine:
            assert f"node {mine}" in text, text
        else:
            assert "nodes this process does not hold (it holds" in text, text


def test_an_in_process_run_keeps_every_nodes_part_and_the_same_bits() -> None:
    """In one process every simulated node is local: the plan kept is whole (its body
    counts and digest taken), the results the same bits as a run that keeps it as made."""

    def prog() -> tuple[Any, ...]:
        X = ap.dvector(60, shape=(), data=np.linspace(0.0, 1.0, 60), name="X")

        def body(j: int) -> None:
            X[j] = X[j] * 0.5 + X[(j + 7) % 60]

        for _ in range(3):
            ap.async_for(0, 60, body, name="b")
        plan = ap.plan_of("b")
        return X.gather(), plan.kept, plan.partial, plan.digest is not None

    x, kept, partial, digested = ap.run(prog, nodes=3).value
    assert kept == (0, 1, 2) and not partial and digested
    with pytest.MonkeyPatch.context() as mp:
        from engine._asyncfor import loop as _loop

        mp.setattr(_loop, "_keep_own_parts", lambda sess, st: None)
        ref, kept_ref, _, _ = ap.run(prog, nodes=3).value
    assert kept_ref is None and np.array_equal(x, ref)
