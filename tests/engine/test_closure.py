"""The closure rule against mutation through calls (engine/_closure.py, ``guard``).

Every mutation below passes the static check (no assignment to a captured name); the
dynamic guard must catch it in reconnaissance, in checked mode, and on both sides of the
dual tests, and name what changed and the first index (or minibatch) that changed it.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.random import rand as np_rand  # a global generator's method, imported by name

import engine as ap
from engine._asyncfor import closure
from engine._asyncfor.closure import reachable
from replay import testing

N = 8  # loop indices (async_for) / data elements (sync_for, minibatch 1)

LOG: list[int] = []  # appended to by helpers, two calls deep
MODLIST: list[int] = []  # appended to through the module object
CONST = (1.0, 2.0)


def helper(j: int) -> None:
    LOG.append(j)


def outer(j: int) -> None:
    helper(j)


def reading_helper(j: int) -> float:
    scratch = [CONST[0], float(j)]
    scratch.append(math.sqrt(j + 1.0))
    return sum(scratch)


class Registry:
    items: list[int] = []


@dataclass
class Stats:
    log: list[int] = field(default_factory=list)
    scale: float = 1.0

    def note(self, j: int) -> None:
        self.log.append(j)

    def factor(self) -> float:
        return self.scale * 2.0


@pytest.fixture(autouse=True)
def _reset(monkeypatch: pytest.MonkeyPatch) -> None:
    LOG.clear()
    MODLIST.clear()
    Registry.items.clear()
    # compare contents after every body however slow, so the indices named are exact
    monkeypatch.setattr(closure, "CHECK_SHARE", float("inf"))


# --------------------------------------------------------------------- the mutations
# Each maker returns (mutate(j), the name the error must give).  ``mutate`` captures the
# state it changes the way a user's body would.
def _append() -> tuple[Callable[[int], None], str]:
    seen: list[int] = []
    return (lambda j: seen.append(j)), "'seen' (list)"


def _extend() -> tuple[Callable[[int], None], str]:
    seen: list[int] = []
    return (lambda j: seen.extend([j, j])), "'seen' (list)"


def _add_at() -> tuple[Callable[[int], None], str]:
    counts = np.zeros(N)
    return (lambda j: np.add.at(counts, [j], 1.0)), "'counts' (ndarray)"


def _setdefault() -> tuple[Callable[[int], None], str]:
    d: dict[int, list[int]] = {}
    return (lambda j: d.setdefault(j, [])), "'d' (dict)"


def _nested_append() -> tuple[Callable[[int], None], str]:
    d: dict[str, list[int]] = {"a": []}
    return (lambda j: d["a"].append(j)), "'d' (dict)"


def _set_add() -> tuple[Callable[[int], None], str]:
    s: set[int] = set()
    return (lambda j: s.add(j)), "'s' (set)"


def _attribute() -> tuple[Callable[[int], None], str]:
    obj = Stats()
    return (lambda j: obj.log.append(j)), "'obj' (Stats)"


def _method() -> tuple[Callable[[int], None], str]:
    obj = Stats()
    return (lambda j: obj.note(j)), "'obj' (Stats)"


def _helper() -> tuple[Callable[[int], None], str]:
    return (
        lambda j: helper(j)
    ), "'LOG' (list, global in test_closure.py) via <lambda>() -> helper()"


def _helper_deep() -> tuple[Callable[[int], None], str]:
    return (
        lambda j: outer(j)
    ), "'LOG' (list, global in test_closure.py) via <lambda>() -> outer() -> helper()"


def _module_attr() -> tuple[Callable[[int], None], str]:
    mod = sys.modules[__name__]
    return (lambda j: mod.MODLIST.append(j)), f"'{__name__}.MODLIST' (list)"


def _class_attr() -> tuple[Callable[[int], None], str]:
    return (lambda j: Registry.items.append(j)), "'Registry.items' (list)"


def _default() -> tuple[Callable[[int], None], str]:
    def mutate(j: int, acc: list[int] = []) -> None:  # noqa: B006 - the point of the test
        acc.append(j)

    return mutate, "'acc' (list, default argument of"


def _bytearray() -> tuple[Callable[[int], None], str]:
    buf = bytearray(N)
    return (lambda j: buf.__setitem__(j, 1)), "'buf' (bytearray)"


def _array_view() -> tuple[Callable[[int], None], str]:
    a = np.zeros((N, 2))
    col = a[:, 1]  # a strided view: hashed through a contiguous copy
    return (lambda j: np.copyto(col, j + 1.0)), "'col' (ndarray)"


def _large_array() -> tuple[Callable[[int], None], str]:
    big = np.zeros(100_000)  # above COPY_BYTES: write-protected while bodies run
    return (lambda j: np.copyto(big[j : j + 1], 1.0)), "'big' (ndarray)"


def _large_list() -> tuple[Callable[[int], None], str]:
    many = list(range(5000))  # above LARGE_ITEMS: compared by length and ends
    return (lambda j: many.append(j)), "'many' (list)"


def _large_dict() -> tuple[Callable[[int], None], str]:
    table = {k: [k] for k in range(5000)}
    return (lambda j: table.setdefault(-j - 1, [])), "'table' (dict)"


MUTATIONS: dict[str, Callable[[], tuple[Callable[[int], None], str]]] = {
    "large array": _large_array,
    "large list": _large_list,
    "large dict": _large_dict,
    "append": _append,
    "extend": _extend,
    "np.add.at": _add_at,
    "dict.setdefault": _setdefault,
    "nested append": _nested_append,
    "set.add": _set_add,
    "attribute": _attribute,
    "method": _method,
    "helper": _helper,
    "helper two deep": _helper_deep,
    "module attribute": _module_attr,
    "class attribute": _class_attr,
    "default argument": _default,
    "bytearray": _bytearray,
    "strided view": _array_view,
}


class Trainer:
    """The bodies as methods of an object (``ap.async_for(0, n, trainer.step)``) that
    holds the mutating call as an attribute, as a trainer holds a callback or a model."""

    def __init__(self, X: Any, mutate: Callable[[int], None], at: int, invocation: int) -> None:
        self.X, self.callback, self.at, self.invocation = X, mutate, at, invocation
        self.current = [0]

    def step(self, j: int) -> None:
        self.X[j] = self.X[j] + 1.0
        self._maybe(j)

    def sync_step(self, batch: ap.Batch) -> None:
        self.X[batch.number] = self.X[batch.number] + float(batch.values[0, 0])
        self._maybe(batch.number)

    def _maybe(self, j: int) -> None:  # only a helper names the callback
        if self.current[0] == self.invocation and j == self.at:
            self.callback(j)


def program(
    kind: str,
    mutation: str,
    at: int,
    invocation: int,
    outcome: dict[str, Any] | None = None,
    form: str = "function",
) -> Callable[[], None]:
    """A driver with two invocations of one loop; ``mutation`` runs only at index (or
    minibatch) ``at`` of invocation ``invocation`` (1: after reconnaissance); ``form``:
    the body is a nested function, or a ``method`` of a :class:`Trainer`."""

    def driver() -> None:
        mutate, label = MUTATIONS[mutation]()
        if outcome is not None:
            outcome["label"] = label
        X = ap.dvector(N, shape=(), name="X")
        data = ap.dvector(N, shape=(1,), init=ap.init.uniform(0, 1), name="data")
        current = [0]  # the driver's invocation counter, read-only in the body
        trainer = Trainer(X, mutate, at, invocation)

        def body(j: int) -> None:
            X[j] = X[j] + 1.0
            if current[0] == invocation and j == at:
                mutate(j)

        def sync_body(batch: ap.Batch) -> None:
            X[batch.number] = X[batch.number] + float(batch.values[0, 0])
            if current[0] == invocation and batch.number == at:
                mutate(batch.number)

        if form == "method":
            body, sync_body = trainer.step, trainer.sync_step  # type: ignore[assignment]
        for it in range(2):
            current[0] = trainer.current[0] = it
            if kind == "async":
                ap.async_for(0, N, body, name="loop")
            else:
                ap.sync_for(data, 1, sync_body, name="loop")
            ap.log_objective("x", float(X.gather().sum()))

    return driver


def _expect(info: pytest.ExceptionInfo, kind: str, label: str, at: int, invocation: int) -> None:
    msg = str(info.value)
    assert label in msg, msg
    where = "index" if kind == "async" else "minibatch"
    assert f"{where} {at} (invocation {invocation})" in msg, msg
    assert f"{kind}_for 'loop'" in msg and "closure rule" in msg, msg


# --------------------------------------------------------------------- reconnaissance
@pytest.mark.parametrize("form", ["function", "method"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@pytest.mark.parametrize("kind", ["async", "sync"])
def test_reconnaissance_catches_mutation_through_calls(kind: str, mutation: str, form: str) -> None:
    out: dict[str, Any] = {}
    with pytest.raises(ap.ClosureRuleError) as info:
        ap.run(program(kind, mutation, at=3, invocation=0, outcome=out, form=form), nodes=2)
    _expect(info, kind, out["label"], 3, 0)


def test_reconnaissance_exits_at_the_first_body_that_mutates() -> None:
    ran: list[int] = []
    X = []

    def driver() -> None:
        seen: list[int] = []
        Y = ap.dvector(N, shape=(), name="Y")
        X.append(Y)

        def body(j: int) -> None:
            Y[j] = 1.0
            if j >= 2:
                seen.append(j)

        try:
            ap.async_for(0, N, body, name="loop")
        finally:
            ran.append(len(seen))

    with pytest.raises(ap.ClosureRuleError, match="index 2 "):
        ap.run(driver)
    assert ran == [1]  # stopped right after the first offending body
    assert X[0].gather().sum() == 0.0  # reconnaissance committed nothing


def direct_bodies() -> list[tuple[Callable[[int], None], str]]:
    """Bodies that mutate captured state themselves (no helper in between)."""
    seen: list[int] = []
    counts = np.zeros(N)
    d: dict[int, int] = {}
    s: set[int] = set()
    obj = Stats()

    def append(j: int) -> None:
        seen.append(j)

    def add_at(j: int) -> None:
        np.add.at(counts, [j], 1.0)

    def setdefault(j: int) -> None:
        d.setdefault(j, 0)

    def set_add(j: int) -> None:
        s.add(j)

    def attribute(j: int) -> None:
        obj.log.append(j)

    def default(j: int, acc: list[int] = []) -> None:  # noqa: B006
        acc.append(j)

    def in_place(j: int) -> None:
        np.multiply(counts, 1.0, out=counts)  # writing the same bytes is no change
        counts.sort()  # nor is sorting sorted data
        if j == 1:
            np.add(counts, 1.0, out=counts)

    return [
        (append, "'seen' (list)"),
        (add_at, "'counts' (ndarray)"),
        (setdefault, "'d' (dict)"),
        (set_add, "'s' (set)"),
        (attribute, "'obj' (Stats)"),
        (default, "'acc' (list, default argument of default)"),
        (in_place, "'counts' (ndarray)"),
    ]


@pytest.mark.parametrize("k", range(7))
@pytest.mark.parametrize("kind", ["async", "sync"])
def test_reconnaissance_catches_direct_mutation_in_the_body(kind: str, k: int) -> None:
    labels: list[str] = []

    def driver() -> None:
        fn, label = direct_bodies()[k]
        labels.append(label)
        X = ap.dvector(N, shape=(), name="X")
        data = ap.dvector(N, shape=(1,), name="data")

        def sync_body(batch: ap.Batch) -> None:
            fn(batch.number)

        if kind == "async":
            ap.async_for(0, N, fn, name="loop")
        else:
            ap.sync_for(data, 1, sync_body, name="loop")
        X[0] = 1.0

    with pytest.raises(ap.ClosureRuleError) as info:
        ap.run(driver)
    assert labels[0] in str(info.value)
    first = 1 if k == 6 else 0
    assert f"{'index' if kind == 'async' else 'minibatch'} {first} " in str(info.value)


# --------------------------------------------------------------------- checked mode
@pytest.mark.parametrize("form", ["function", "method"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_normal_run_catches_mutation_after_reconnaissance(
    kind: str, mutation: str, form: str
) -> None:
    """Reconnaissance runs the bodies of the first invocation only, and a normal run runs
    them bare: a mutation that first happens later (``if x > 2: seen.append(j)``) left
    state that differed with the placement, exit 0.  A normal run now compares what the
    body reaches after every invocation; checked mode names the index."""
    out: dict[str, Any] = {}
    with pytest.raises(ap.ClosureRuleError) as info:
        ap.run(program(kind, mutation, at=5, invocation=1, outcome=out, form=form), nodes=2)
    msg = str(info.value)
    assert out["label"] in msg and f"{kind}_for 'loop'" in msg, msg
    assert "at one of the calls (invocation 1)" in msg and "--checked to name the" in msg, msg
    with pytest.raises(ap.ClosureRuleError) as named:
        prog = program(kind, mutation, at=5, invocation=1, outcome=out, form=form)
        ap.run(prog, nodes=2, checked=True)
    _expect(named, kind, out["label"], 5, 1)


def test_checked_mode_with_threads_names_the_variable() -> None:
    out: dict[str, Any] = {}
    with pytest.raises(ap.ClosureRuleError, match="'seen' \\(list\\)"):
        ap.run(program("async", "append", 5, 1, out), nodes=2, threads=2, checked=True)


# --------------------------------------------------------------------- dual tests
@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("mutation", ["append", "helper"])
def test_dual_tests_catch_mutation_on_either_side(kind: str, mutation: str, direction: str) -> None:
    # forward runs the serial side first, backward the parallel side first
    out: dict[str, Any] = {}
    with pytest.raises(ap.ClosureRuleError) as info:
        testing.dual(program(kind, mutation, 5, 1, out), nodes=2, direction=direction)
    _expect(info, kind, out["label"], 5, 1)


def test_test_mode_checks_every_body_of_both_loops() -> None:
    for kind in ("async", "sync"):
        out: dict[str, Any] = {}
        with pytest.raises(ap.ClosureRuleError, match="invocation 1"):
            ap.run(program(kind, "set.add", 5, 1, out), nodes=3, test_mode=True)


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(["async", "sync"]),
    mutation=st.sampled_from(sorted(MUTATIONS)),
    at=st.integers(0, N - 1),
    invocation=st.integers(0, 1),
    nodes=st.integers(1, 3),
)
def test_any_mutation_anywhere_is_caught_in_checked_mode(
    kind: str, mutation: str, at: int, invocation: int, nodes: int
) -> None:
    LOG.clear()
    MODLIST.clear()
    Registry.items.clear()
    out: dict[str, Any] = {}
    with pytest.raises(ap.ClosureRuleError) as info:
        ap.run(program(kind, mutation, at, invocation, out), nodes=nodes, checked=True)
    _expect(info, kind, out["label"], at, invocation)


# --------------------------------------------------------------------- no false positives
GEN = np.random.default_rng(0)  # a global generator the body never touches
TABLE = np.arange(N, dtype=np.float64)  # a global array, only read
NAMES = {"a": 1, "b": 2}  # a global dict, only read


def typical() -> None:
    """Bodies that read captured lists, arrays, dicts, objects, globals and helpers, use
    ``ap.rng()``, numpy and math, and mutate only locals and DDS."""
    X = ap.dvector(N, shape=(2,), name="X")
    Y = ap.dvector(N, shape=(), name="Y")
    tables = [X, Y]
    by_name = {"X": X, "Y": Y}
    weights = np.linspace(0.0, 1.0, N)
    nan_row = np.array([np.nan, 1.0])  # NaN != NaN must not look like a change
    stats = Stats(scale=0.5)
    shape = (N, 2)
    data = ap.dvector(N, shape=(1,), init=ap.init.uniform(0, 1), name="data")

    def body(j: int, scale: float = 2.0) -> None:
        local: list[float] = []
        local.append(weights[j] * scale)
        local.extend([TABLE[j], float(NAMES["a"])])
        noise = float(ap.rng().random())
        row = np.zeros(2)
        np.add.at(row, [0], 1.0)
        row += nan_row[1] + stats.factor() + reading_helper(j)
        vals = [math.sqrt(abs(v)) for v in local]
        X[j] = row + sum(vals) * noise
        tables[1][j] = Y[j] + len(shape)
        by_name["Y"][j] += 1.0
        _ = sorted(NAMES.items(), key=lambda kv: kv[1])

    def sync_body(batch: ap.Batch) -> None:
        m = batch.number
        grad = batch.values.mean(axis=0) * weights[m] + float(ap.rng().random())
        Y[m] = Y[m] + float(grad[0]) + stats.factor()

    for _ in range(2):
        ap.async_for(0, N, body, name="typical")
        ap.sync_for(data, 1, sync_body, name="typical_sync")
        ap.log_objective("s", float(X.gather().sum() + Y.gather().sum()))


class Model:
    """DDS held in attributes, written by a method body and by a closure through them
    (``self.W[j] = ...``, ``model.slots.Z[j] = ...``), as object-style programs do."""

    def __init__(self) -> None:
        self.W = ap.dvector(N, shape=(), name="W")
        self.slots = Slotted(ap.dvector(N, shape=(), name="Z"))
        self.rate = 0.5

    def step(self, j: int) -> None:
        self.W[j] = self.W[j] + self.rate
        self.slots.Z[j] += self.W[j]

    @property
    def view(self) -> Any:
        return self.W


class Slotted:
    __slots__ = ("Z",)

    def __init__(self, Z: Any) -> None:
        self.Z = Z


def object_style() -> None:
    model = Model()

    def body(j: int) -> None:
        model.W[j] = model.W[j] * 2.0
        model.slots.Z[j] = model.slots.Z[j] - 1.0
        model.view[j] += 1.0  # a property: only the guard can tell, and it sees no change

    for _ in range(2):
        ap.async_for(0, N, model.step, name="method")
        ap.async_for(0, N, body, name="attributes")
        ap.log_objective("s", float(model.W.gather().sum() + model.slots.Z.gather().sum()))


@pytest.mark.parametrize("kw", [{}, {"checked": True}, {"nodes": 2, "threads": 2}])
def test_dds_written_through_attributes_are_not_flagged(kw: dict[str, Any]) -> None:
    ap.run(object_style, **kw)


class Counter:
    def __init__(self) -> None:
        self.X = ap.dvector(N, shape=(), name="X")
        self.count, self.seen, self.later = 0, [0] * N, 0
        self.box = Slotted([0] * N)

    def count_up(self, j: int) -> None:
        self.count += 1

    def mark(self, j: int) -> None:
        self.seen[j] = 1

    def mark_slot(self, j: int) -> None:
        self.box.Z[j] = 1

    def on_later_invocations(self, j: int) -> None:
        if self.count > 0:  # never at reconnaissance: only the static check can see it
            self.later = j
        self.X[j] = 1.0


@pytest.mark.parametrize(
    "method,part",
    [
        ("count_up", "self.count"),
        ("mark", "self.seen"),
        ("mark_slot", "self.box.Z"),
        ("on_later_invocations", "self.later"),
    ],
)
def test_a_method_body_assigning_to_its_object_is_rejected_before_it_runs(
    method: str, part: str
) -> None:
    def driver() -> None:
        counter = Counter()
        ap.async_for(0, N, getattr(counter, method), name="loop")

    with pytest.raises(ap.ClosureRuleError) as info:
        ap.run(driver)
    msg = str(info.value)
    assert f"captured variable 'self' (Counter) through {part} at " in msg, msg
    assert f"Make '{part}' a DDS" in msg, msg


@pytest.mark.parametrize(
    "kw", [{}, {"checked": True}, {"test_mode": True}, {"nodes": 3, "threads": 2, "checked": True}]
)
def test_typical_bodies_are_not_flagged(kw: dict[str, Any]) -> None:
    state = GEN.bit_generator.state
    ap.run(typical, **kw)
    assert GEN.bit_generator.state == state


def test_typical_bodies_pass_the_dual_tests() -> None:
    testing.assert_dual(typical, nodes=2, threads=2, order="random")


def test_the_driver_may_change_captured_state_between_invocations() -> None:
    def driver() -> None:
        X = ap.dvector(N, shape=(), name="X")
        rates = [0.1]

        def body(j: int) -> None:
            X[j] = X[j] + rates[-1]

        for _ in range(3):
            ap.async_for(0, N, body, name="decay")
            rates.append(rates[-1] * 0.5)  # the driver, between invocations: allowed

    ap.run(driver, checked=True)
    ap.run(driver, test_mode=True)


def test_large_arrays_are_write_protected_only_while_bodies_run() -> None:
    big = np.zeros(100_000)
    flags: list[bool] = []

    def driver(write: bool) -> None:
        X = ap.dvector(N, shape=(), name="X")

        def body(j: int) -> None:
            X[j] = big[j] + 1.0  # reading is fine
            if write and j == 4:
                big.sort()  # in place, through a method: the write flag stops it

        for _ in range(2):
            ap.async_for(0, N, body, name="big")
            flags.append(big.flags.writeable)
            big[0] = 0.0  # the driver may write between invocations

    ap.run(driver, {"write": False}, checked=True)
    assert flags == [True, True]
    with pytest.raises(ap.ClosureRuleError, match="at index 4 .*'big' \\(ndarray\\)"):
        ap.run(driver, {"write": True}, nodes=2)
    assert big.flags.writeable


@pytest.mark.parametrize("n", [N, 200])
def test_large_arrays_changed_past_the_write_flag_are_caught_by_comparison(n: int) -> None:
    """``np.add.at`` ignores the write flag (numpy 2.x): the periodic comparison with the
    baseline copy, or the one after the last body, names a range of bodies."""
    big = np.zeros(100_000)

    def driver() -> None:
        X = ap.dvector(n, shape=(), name="X")

        def body(j: int) -> None:
            X[j] = 1.0
            if j == 5:
                np.add.at(big, [0], 1.0)

        ap.async_for(0, n, body, name="big")

    with pytest.raises(ap.ClosureRuleError) as info:
        ap.run(driver)
    msg = str(info.value)
    assert "'big' (ndarray)" in msg and "invocation 0" in msg, msg
    last = f"index {N - 1}" if n == N else "index 11"  # compared every 12 bodies (800 kB)
    assert f"a body between index 0 and {last}" in msg, msg


@pytest.mark.parametrize("every,last", [(1000, "index 49"), (10, "index 9")])
def test_costly_comparisons_run_every_few_bodies_and_after_the_last(
    monkeypatch: pytest.MonkeyPatch, every: int, last: str
) -> None:
    monkeypatch.setattr(closure, "CHECK_SHARE", 1e-12)  # any comparison costs too much
    monkeypatch.setattr(closure, "MAX_EVERY", every)
    seen: list[int] = []

    def driver() -> None:
        X = ap.dvector(50, shape=(), name="X")

        def body(j: int) -> None:
            X[j] = 1.0
            if j == 5:
                seen.append(j)

        ap.async_for(0, 50, body, name="slow")

    with pytest.raises(ap.ClosureRuleError) as info:
        ap.run(driver)
    assert f"'seen' (list) at a body between index 0 and {last} (invocation 0)" in str(info.value)


# --------------------------------------------------------------------- what is reached
def test_reachable_roots_follow_user_code_only() -> None:
    stats = Stats()
    weights = np.zeros(3)

    def body(j: int, acc: list[int] = []) -> None:  # noqa: B006
        outer(j)
        stats.factor()
        f = lambda: Registry.items  # noqa: E731 - a nested code object
        f()
        np.add(weights, 1.0)
        ap.rng()

    labels = {r.label for r in reachable(body)}
    assert {"'stats'", "'weights'", "'acc'", "'Registry'", "'Registry.items'"} <= labels
    assert "'LOG'" in labels and "'np'" in labels and "'ap'" in labels
    # engine, numpy and math are not user code: nothing inside them is a root
    assert not any(label.startswith(("'engine.", "'numpy.")) for label in labels)


def test_a_deferred_comparison_names_every_state_that_changed() -> None:
    """When contents are compared only every few bodies (fast bodies, costly fingerprint),
    the check that finds a change may see several: it names all of them, whatever the
    machine's timing made the comparison interval."""
    seen: list[int] = []
    counts = np.zeros(4)

    def body(j: int) -> None:
        if j == 1:
            seen.append(j)
        if j == 2:
            counts[0] += 1

    g = closure.guard(body, "two", 0)
    g(0)  # the first body sets the interval; then force a long one
    g.every = 10
    g(1)
    g(2)
    with pytest.raises(ap.ClosureRuleError) as info:
        g.finish()
    msg = str(info.value)
    assert "'seen'" in msg and "'counts'" in msg and "between index 1 and index 2" in msg


# --------------------------------------------------------------------- the static verdict
TARGET: Any = None  # a global the body below writes into: a DDS or not, by the test


def _writes_target(j: int) -> None:
    TARGET[j] = 1.0


def test_the_static_verdict_follows_what_a_global_holds() -> None:
    """Whether ``TARGET[j] = v`` is allowed depends on what ``TARGET`` holds at each call."""
    global TARGET
    TARGET = ap.dvector(N, shape=(), name="T")
    closure.check_body("loop", _writes_target)
    TARGET = [0.0] * N
    with pytest.raises(ap.ClosureRuleError, match="captured variable 'TARGET' \\(list\\)"):
        closure.check_body("loop", _writes_target)
    TARGET = ap.dvector(N, shape=(), name="T2")
    closure.check_body("loop", _writes_target)


class Holder:
    def __init__(self, W: Any, Z: Any, T: Any) -> None:
        self.W = W
        self.slots = Slotted(Z)
        self.tables: list[Any] = [T]

    def step(self, j: int) -> None:
        self.W[j] = 1.0


def rebinding_driver(where: str) -> Callable[[], None]:
    """A driver that rebinds what a body's subscript target refers to, from a DDS to a
    list, between two invocations of a normal (unchecked) run: the second must be refused,
    whichever way the body reaches the target."""

    def driver() -> None:
        h = Holder(*(ap.dvector(N, shape=(), name=name) for name in ("W", "Z", "T")))
        X: Any = ap.dvector(N, shape=(), name="X")

        def closure_var(j: int) -> None:
            X[j] = 1.0

        def attribute(j: int) -> None:
            h.W[j] = 1.0

        def slot(j: int) -> None:
            h.slots.Z[j] = 1.0

        def item(j: int) -> None:
            h.tables[0][j] = 1.0

        body = {"closure": closure_var, "attribute": attribute, "slot": slot, "item": item}
        body["method"] = h.step
        for epoch in range(2):
            ap.async_for(0, N, body[where], name="loop")
            if epoch == 0:
                X = [0.0] * N
                h.W = [0.0] * N
                h.slots.Z = [0.0] * N
                h.tables[0] = [0.0] * N

    return driver


@pytest.mark.parametrize("where", ["closure", "attribute", "slot", "item", "method"])
def test_a_target_rebound_from_a_dds_to_a_list_between_invocations_is_refused(
    where: str,
) -> None:
    with pytest.raises(ap.ClosureRuleError, match="the loop body assigns to captured variable"):
        ap.run(rebinding_driver(where))


def test_the_static_verdict_costs_no_parse_per_invocation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The source is parsed once per body code, whatever its names hold later."""
    global TARGET
    TARGET = ap.dvector(N, shape=(), name="P")
    closure.check_body("loop", _writes_target)
    parses: list[Any] = []
    real = closure.ast.parse
    monkeypatch.setattr(closure.ast, "parse", lambda *a, **k: parses.append(a) or real(*a, **k))
    for k in range(3):
        TARGET = ap.dvector(N, shape=(), name=f"P{k}")
        closure.check_body("loop", _writes_target)
    assert parses == []


class _Shadowed:
    W = "class attribute"

    @property
    def P(self) -> str:
        return "property"


def test_the_fast_attribute_lookup_agrees_with_getattr_static() -> None:
    """``_instance_attribute`` answers only where the instance ``__dict__`` decides, and
    then as :func:`inspect.getattr_static` does; elsewhere it defers to it."""
    import inspect

    plain, shadowed = Holder(1, 2, 3), _Shadowed()
    shadowed.__dict__.update(W="instance", P="instance", V="instance")
    cases = [
        (plain, "W"),
        (plain, "missing"),
        (shadowed, "W"),
        (shadowed, "P"),
        (shadowed, "V"),
        (Slotted(1), "Z"),
        (sys.modules[__name__], "TARGET"),
        (Holder, "step"),
    ]
    answered = 0
    for owner, name in cases:
        got = closure._instance_attribute(owner, name)
        if got is not closure._UNKNOWN:
            answered += 1
            assert got is inspect.getattr_static(owner, name), (owner, name)
    assert answered == 3  # plain.W, shadowed.V, the module's TARGET


_POOL: list[Any] = []  # DDS for the property below, made once (names are per session)


def _bodies_writing_through(h: Holder) -> dict[str, Callable[..., Any]]:
    X: Any = None

    def closure_var(j: int) -> None:
        X[j] = 1.0

    def attribute(j: int) -> None:
        h.W[j] = 1.0

    def slot(j: int) -> None:
        h.slots.Z[j] += 1.0

    def item(j: int) -> None:
        h.tables[0][j] = 1.0

    return {
        "global": _writes_target,
        "closure": closure_var,
        "attribute": attribute,
        "slot": slot,
        "item": item,
        "method": h.step,
    }


@settings(max_examples=60, deadline=None)
@given(
    where=st.sampled_from(["global", "closure", "attribute", "slot", "item", "method"]),
    kinds=st.lists(st.sampled_from(["dds", "list", "array", "tuple"]), min_size=1, max_size=6),
)
def test_the_static_verdict_follows_every_rebinding(where: str, kinds: list[str]) -> None:
    """Whatever the driver rebinds a body's subscript target to, and however often, each
    check refuses exactly the calls whose target is not a DDS at that moment."""
    global TARGET
    if not _POOL:
        _POOL.extend(ap.dvector(N, shape=(), name=f"pool{k}") for k in range(2))
    h = Holder(*_POOL[:1] * 3)
    body = _bodies_writing_through(h)[where]
    for step, kind in enumerate(kinds):
        value = {
            "dds": _POOL[step % 2],
            "list": [0.0] * N,
            "array": np.zeros(N),
            "tuple": (0.0,) * N,
        }[kind]
        TARGET = value
        if where == "closure":
            body.__closure__[0].cell_contents = value  # type: ignore[attr-defined, index]
        h.W, h.slots.Z, h.tables[0] = value, value, value
        if kind == "dds":
            closure.check_body("loop", body)
        else:
            with pytest.raises(ap.ClosureRuleError, match="assigns to captured variable"):
                closure.check_body("loop", body)


# --------------------------------------------------------------------- aggregation functions
# ``register_aggregation(W, fn)``: ``fn`` is called once per clock per owner, so state it
# keeps changes a different number of times on 1 and 2 ranks, in ``replay single``, in a
# resumed run and on the dual tests' serial side (before: a counter in it gave -5.85 on
# one rank, -4.5 on two, and the dual test passed).  It is held to the closure rule.
def aggregation_program(mutation: str, invocation: int, sync: str = "bsp") -> Callable[[], None]:
    def driver() -> None:
        mutate, _ = MUTATIONS[mutation]()
        X = ap.dvector(4, shape=(), name="X")
        data = ap.dvector(N, shape=(1,), init=ap.init.uniform(0, 1), name="data")
        current = [0]

        def agg(deltas: np.ndarray) -> np.ndarray:
            if current[0] == invocation:
                mutate(0)
            return deltas.sum(axis=0)

        ap.register_aggregation(X, agg)

        def body(batch: ap.Batch) -> None:
            X[batch.number % 4] += float(batch.values[0, 0])

        for it in range(2):
            current[0] = it
            ap.sync_for(data, 1, body, sync=sync, name="loop")

    return driver


AGG_PLACEMENTS: list[dict[str, Any]] = [
    {},
    {"nodes": 2},
    {"nodes": 2, "threads": 2},
    {"nodes": 3, "checked": True},
]


@pytest.mark.parametrize("placement", AGG_PLACEMENTS, ids=str)
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_an_aggregation_function_that_changes_state_is_stopped(
    mutation: str, placement: dict[str, Any]
) -> None:
    label = MUTATIONS[mutation]()[1]
    with pytest.raises(ap.ClosureRuleError) as info:
        ap.run(aggregation_program(mutation, 0), **placement)
    msg = str(info.value)
    assert msg.startswith("sync_for 'loop': ") and "the aggregation function of 'X' " in msg
    assert label in msg and "(invocation 0)" in msg, msg


@pytest.mark.parametrize("sync", ["bsp", "ssp", "hybrid"])
@pytest.mark.parametrize("kw", [{"checked": True}, {"test_mode": True}])
def test_a_later_change_is_stopped_in_checked_and_test_mode(sync: str, kw: dict[str, Any]) -> None:
    with pytest.raises(
        ap.ClosureRuleError, match=r"'s' \(set\) via <lambda>\(\) at deltas of shape .*invocation 1"
    ):
        ap.run(aggregation_program("set.add", 1, sync), nodes=2, threads=2, **kw)


@pytest.mark.parametrize("sync", ["bsp", "ssp", "hybrid"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_later_change_is_stopped_in_a_normal_run(sync: str, mutation: str) -> None:
    """After the first invocation a normal run calls the aggregation function bare, and
    compares what it reaches after every invocation (before: it did not look)."""
    label = MUTATIONS[mutation]()[1]
    with pytest.raises(ap.ClosureRuleError) as info:
        ap.run(aggregation_program(mutation, 1, sync), nodes=2, threads=2)
    msg = str(info.value)
    assert msg.startswith("sync_for 'loop': the aggregation function of 'X' changed"), msg
    assert label in msg and "at one of the calls (invocation 1)" in msg, msg
    assert "--checked to name the deltas" in msg, msg


def test_the_dual_test_stops_an_aggregation_function_that_changes_state() -> None:
    with pytest.raises(ap.ClosureRuleError, match="the aggregation function of 'X'"):
        testing.dual(aggregation_program("append", 0), nodes=2)


class Momentum:
    def __init__(self) -> None:
        self.count = 0

    def aggregate(self, deltas: np.ndarray) -> np.ndarray:
        self.count += 1
        return deltas.sum(axis=0)


def _static_aggregations() -> dict[str, tuple[Callable[[np.ndarray], np.ndarray], str]]:
    calls = [0]
    velocity = np.zeros(4)
    total = 0.0

    def counter(deltas: np.ndarray) -> np.ndarray:
        calls[0] += 1
        return deltas.sum(axis=0)

    def momentum(deltas: np.ndarray) -> np.ndarray:
        velocity[: deltas.shape[1]] = 0.9 * velocity[: deltas.shape[1]] + deltas.sum(axis=0)
        return velocity[: deltas.shape[1]].copy()

    def rebinding(deltas: np.ndarray) -> np.ndarray:
        nonlocal total
        total += 1.0
        return deltas.sum(axis=0)

    return {
        "counter": (counter, "captured variable 'calls' (list)"),
        "momentum": (momentum, "captured variable 'velocity' (ndarray)"),
        "rebinding": (rebinding, "captured variable 'total' (float)"),
        "method": (Momentum().aggregate, "captured variable 'self' (Momentum) through self.count"),
    }


@pytest.mark.parametrize("case", ["counter", "momentum", "rebinding", "method"])
def test_an_aggregation_function_assigning_to_captured_state_is_refused_before_it_runs(
    case: str,
) -> None:
    def driver() -> None:
        fn, _ = _static_aggregations()[case]
        X = ap.dvector(4, shape=(), name="X")
        data = ap.dvector(N, shape=(1,), init=ap.init.uniform(0, 1), name="data")
        ap.register_aggregation(X, fn)

        def body(batch: ap.Batch) -> None:
            X[batch.number % 4] += 1.0

        ap.sync_for(data, 1, body, name="loop")

    with pytest.raises(ap.ClosureRuleError) as info:
        ap.run(driver, nodes=2)
    msg = str(info.value)
    assert msg.startswith("'loop': the aggregation function of 'X' assigns to "), msg
    assert _static_aggregations()[case][1] in msg, msg


@pytest.mark.parametrize("kw", [{}, {"nodes": 2, "threads": 2}, {"nodes": 3, "checked": True}])
def test_pure_aggregation_functions_reading_captured_state_are_not_flagged(
    kw: dict[str, Any],
) -> None:
    """Reading captured numbers, arrays and helpers, and a driver that changes them
    between invocations, are allowed."""
    weights = np.linspace(1.0, 2.0, 8)

    def driver() -> None:
        scale = [1.0]
        X = ap.dvector(4, shape=(), name="X")
        data = ap.dvector(N, shape=(1,), init=ap.init.uniform(0, 1), name="data")
        ap.register_aggregation(
            X, lambda d: np.median(d, axis=0) * scale[0] + weights[: len(d)].sum() * 0.0
        )

        def body(batch: ap.Batch) -> None:
            X[batch.number % 4] += float(batch.values[0, 0])

        for _ in range(3):
            ap.sync_for(data, 1, body, name="loop")
            scale[0] *= 0.5  # the driver, between invocations

    ap.run(driver, **kw)
    testing.assert_dual(driver, nodes=2)


# --------------------------------------------------------------------- operator functions
# ``ap.map``/``ap.reduce``/``ap.create`` call their function on each element's owner, so
# under MPI each rank calls it on its own part of the data only: state it kept
# (``seen.append(x)``) would hold a different part on each rank and all of it in one
# process, and a driver using it computed per-placement answers with exit 0.
def operator_program(verb: str, mutation: str) -> Callable[[], None]:
    def driver() -> None:
        mutate, _ = MUTATIONS[mutation]()
        A = ap.create(N, lambda i: float(i), name="A")

        def fn(x: Any) -> float:
            mutate(0)
            return float(x)

        if verb == "map":
            ap.map(A, fn, shape=(), name="B")
        elif verb == "reduce":
            ap.reduce(A, fn)
        else:
            ap.create(N, fn, name="C")

    return driver


@pytest.mark.parametrize(
    "kw", [{}, {"nodes": 2}, {"checked": True}, {"nodes": 2, "test_mode": True}], ids=str
)
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@pytest.mark.parametrize("verb", ["map", "reduce", "create"])
def test_an_operator_function_that_changes_state_is_stopped(
    verb: str, mutation: str, kw: dict[str, Any]
) -> None:
    """In every mode: checked and test mode name the element, a normal run compares
    after the last call (before, a normal run did not look)."""
    label = MUTATIONS[mutation]()[1]
    with pytest.raises(ap.ClosureRuleError) as info:
        ap.run(operator_program(verb, mutation), **kw)
    msg = str(info.value)
    assert msg.startswith(f"ap.{verb} ") and "its function" in msg and label in msg, msg


@pytest.mark.parametrize("verb", ["map", "reduce", "create"])
def test_an_operator_function_assigning_to_captured_state_is_refused_before_it_runs(
    verb: str,
) -> None:
    def driver() -> None:
        calls = [0]
        A = ap.create(N, lambda i: float(i), name="A")

        def fn(x: Any) -> float:
            calls[0] += 1
            return float(x)

        {"map": lambda: ap.map(A, fn, shape=()), "reduce": lambda: ap.reduce(A, fn)}.get(
            verb, lambda: ap.create(N, fn)
        )()

    with pytest.raises(ap.ClosureRuleError, match=r"its function assigns to captured variable"):
        ap.run(driver, nodes=2)


def test_pure_operator_functions_and_a_stateful_parser_are_not_flagged(tmp_path: Path) -> None:
    """``ap.load``'s parser runs on every line on every rank, so a vocabulary it builds
    is the same everywhere: it may keep state."""

    def driver(path: str) -> None:
        vocab: dict[str, int] = {}

        def parse(line: str) -> tuple[int, float]:
            word, value = line.split(",")
            return vocab.setdefault(word, len(vocab)), float(value)

        A = ap.load(path, parse=parse, name="A")
        offset = [10.0]
        B = ap.map(A, lambda r: r[1] + offset[0], shape=(), name="B")
        total = ap.reduce(B, lambda v: float(v) * TABLE[1])
        C = ap.create(len(vocab), lambda i: (i, sorted(vocab)[i]), name="C")
        assert total > 0 and len(C) == 2

    path = tmp_path / "d.csv"
    path.write_text("a,1\nb,2\na,3\n")
    for kw in ({}, {"nodes": 2, "checked": True}, {"nodes": 3, "test_mode": True}):
        ap.run(lambda: driver(str(path)), **kw)


# --------------------------------------------------------------------- global generators
# ``np.random.rand()`` or ``random.random()`` in a body draws from a process-wide
# generator whose draws depend on the order bodies run in: a recorded run that could
# never replay (``replay single`` said DIVERGED), and exit 0 at record time.


def _draw_helper() -> float:
    return float(np.random.normal())


def _draws() -> dict[str, tuple[Callable[[], float], str]]:
    return {
        "np.random.rand": (lambda: float(np.random.rand()), "numpy's"),
        "np.random.choice": (lambda: float(np.random.choice(10)), "numpy's"),
        "imported rand": (lambda: float(np_rand()), "numpy's"),
        "helper": (lambda: _draw_helper(), "numpy's"),
        "random.random": (lambda: random.random(), "Python's"),
        "random.shuffle": (lambda: float(random.shuffle([1, 2, 3]) or 0.0), "Python's"),
    }


def drawing_program(draw: str, place: str, invocation: int) -> Callable[[], None]:
    def driver() -> None:
        fn = _draws()[draw][0]
        X = ap.dvector(N, shape=(), name="X")
        data = ap.dvector(N, shape=(1,), init=ap.init.uniform(0, 1), name="data")
        current = [0]

        def body(j: int) -> None:
            X[j] = X[j] + (fn() if current[0] == invocation else 0.0)

        def sync_body(batch: ap.Batch) -> None:
            X[batch.number] += fn() if current[0] == invocation else 0.0

        for it in range(2):
            current[0] = it
            if place == "async":
                ap.async_for(0, N, body, name="loop")
            elif place == "sync":
                ap.sync_for(data, 1, sync_body, name="loop")
            else:
                ap.map(X, lambda v: float(v) + (fn() if current[0] == invocation else 0.0))

    return driver


@pytest.mark.parametrize(
    "place,invocation,kw",
    [
        ("async", 0, {}),
        ("async", 0, {"nodes": 2, "threads": 2}),
        ("async", 1, {"checked": True}),
        ("sync", 0, {"nodes": 2}),
        ("sync", 1, {"test_mode": True}),
        ("map", 1, {"checked": True}),
    ],
)
@pytest.mark.parametrize("draw", sorted(_draws()))
def test_a_draw_from_a_global_generator_is_stopped(
    draw: str, place: str, invocation: int, kw: dict[str, Any]
) -> None:
    which = _draws()[draw][1]
    with pytest.raises(ap.ClosureRuleError) as info:
        ap.run(drawing_program(draw, place, invocation), **kw)
    msg = str(info.value)
    assert f"drew from {which} global random generator" in msg, msg
    assert "Draw from ap.rng() instead" in msg, msg


def test_local_generators_and_a_driver_drawing_between_invocations_are_not_flagged() -> None:
    def driver() -> None:
        X = ap.dvector(N, shape=(), name="X")

        def body(j: int) -> None:
            local = np.random.default_rng(j).random() + random.Random(j).random()
            X[j] = X[j] + local + float(ap.rng().random())

        for _ in range(2):
            ap.async_for(0, N, body, name="loop")
            np.random.rand()  # the driver may: its draws do not depend on how bodies run
            random.random()

    for kw in ({}, {"nodes": 2, "threads": 2, "checked": True}, {"test_mode": True}):
        ap.run(driver, **kw)
    testing.assert_dual(driver, nodes=2)
