"""Python-object DDS elements are handed out and taken in by value.

The class of failure: an element that is a list, dict, set, array or user object reaches
user code by reference, and user code changes it in place (``rec = A[j];
rec.append(x)``).  That write is invisible to the engine: it changes one replica only, is
applied twice when reconnaissance re-runs the body, and is never recorded, so a run ended
with exit 0 and answers that depend on the placement (before this change: ``final s =
72`` in one process, ``60`` on two ranks, for the same program).  Every path between a
DDS and user code is covered here, for every kind of mutable element, on several
placements; the DDS must end as if each read had been a copy and each write had stored
a copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap
from engine._data.values import detached, frozen, stable_text

N = 6


class Box:
    def __init__(self, n: int) -> None:
        self.n, self.c = n, 0

    def __repr__(self) -> str:
        return f"Box({self.n}, {self.c})"


def make(kind: str, i: int) -> Any:
    return {
        "list": lambda: [i, 0],
        "dict": lambda: {"n": i, "c": 0},
        "set": lambda: {i},
        "object": lambda: Box(i),
        "array": lambda: np.array([i, 0.0]),
        "nested": lambda: (i, [0]),
        "named": lambda: Pair(i, [0]),
    }[kind]()


class Pair(NamedTuple):
    n: int
    items: list[int]


def mutate(kind: str, v: Any) -> None:
    if kind == "list":
        v.append(1)
    elif kind == "dict":
        v["c"] += 1
    elif kind == "set":
        v.add(-1)
    elif kind == "object":
        v.c += 1
    elif kind == "array":
        v += 1.0
    else:  # nested, named: the list inside the tuple
        v[1].append(1)


def canon(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"array{v.tolist()}"
    if isinstance(v, set):
        return f"set{sorted(v)}"
    return repr(v)


KINDS = ["list", "dict", "set", "object", "array", "nested", "named"]


def program(kind: str, place: str, out: dict[str, Any]) -> Callable[[], None]:
    """A driver whose only writes go through ``X[i] = v``; at ``place`` it changes, in
    place, a value it read from ``X`` or gave to ``X``."""

    def driver() -> None:
        items = [make(kind, i) for i in range(N)]
        X = ap.dvector(N, data=items, name="X")
        S = ap.dvector(N, shape=(), name="S")

        def reads(j: int) -> None:
            v = X[j]
            mutate(kind, v)
            S[j] = S[j] + 1.0

        def writes(j: int) -> None:
            v = make(kind, j)
            X[j] = v
            mutate(kind, v)  # after the write: the DDS keeps what was written

        def sync_body(batch: ap.Batch) -> None:
            for v in batch.values:
                mutate(kind, v)

        for _ in range(2):
            if place == "async_read":
                ap.async_for(0, N, reads, name="loop")
            elif place == "async_write":
                ap.async_for(0, N, writes, name="loop")
            elif place == "sync_read":
                ap.sync_for(X, 2, sync_body, name="sync")
            elif place == "driver_read":
                mutate(kind, X[1])
            elif place == "driver_iter":
                for v in X:
                    mutate(kind, v)
            elif place == "driver_write":
                v = make(kind, 1)
                X[1] = v
                mutate(kind, v)
            elif place == "gather":
                mutate(kind, X.gather()[2])
            elif place == "map":
                ap.map(X, lambda v: mutate(kind, v) or 0.0, shape=())
            elif place == "reduce":
                ap.reduce(X, lambda v: mutate(kind, v) or 1)
            elif place == "evaluate":
                ap.evaluate(lambda a: mutate(kind, a[3]), X)
            elif place == "data":
                mutate(kind, items[4])
        shared = make(kind, 0)
        Y = ap.create(N, lambda i: shared, name="Y")
        mutate(kind, shared)
        out["X"] = [canon(v) for v in X.gather()]
        out["Y"] = [canon(v) for v in Y.gather()]

    return driver


PLACES = [
    "async_read",
    "async_write",
    "sync_read",
    "driver_read",
    "driver_iter",
    "driver_write",
    "gather",
    "map",
    "reduce",
    "evaluate",
    "data",
]
PLACEMENTS: list[dict[str, Any]] = [
    {},
    {"nodes": 2, "threads": 2},
    {"nodes": 3, "test_mode": True},
    {"nodes": 2, "checked": True},
]


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    place=st.sampled_from(PLACES),
    placement=st.sampled_from(PLACEMENTS),
)
def test_changing_a_value_read_or_written_in_place_never_changes_the_dds(
    kind: str, place: str, placement: dict[str, Any]
) -> None:
    out: dict[str, Any] = {}
    ap.run(program(kind, place, out), **placement)
    assert out["X"] == [canon(make(kind, i)) for i in range(N)]
    assert out["Y"] == [canon(make(kind, 0))] * N


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("place", PLACES)
def test_every_place_and_kind_on_two_nodes(kind: str, place: str) -> None:
    out: dict[str, Any] = {}
    ap.run(program(kind, place, out), nodes=2, threads=2)
    assert out["X"] == [canon(make(kind, i)) for i in range(N)]


def test_dmap_and_dmultimap_values_are_copies() -> None:
    out: dict[str, Any] = {}

    def driver() -> None:
        M = ap.dmap(keys=["a", "b"], name="M")
        M["a"], M["b"] = [1], [2]
        T = ap.dmultimap(keys=["a"], name="T")
        T.add("a", [7])

        def body(j: int) -> None:
            M["a" if j == 0 else "b"].append(9)
            T["a"][0].append(9)

        ap.async_for(0, 2, body, name="loop")
        M["a"].append(5)
        for _, v in M.items():
            v.append(6)
        out["M"], out["T"] = list(M.gather()), list(T.gather())

    ap.run(driver, nodes=2)
    assert out == {"M": [[1], [2]], "T": [([7],)]}


def test_immutable_values_are_passed_as_they_are() -> None:
    """No copy where none is needed: numbers, strings, tuples and named tuples of such
    (the records ``ap.load`` makes) are the stored objects themselves."""
    rec = Pair(1, 2.5)  # type: ignore[arg-type]
    for v in (3, 2.5, "s", b"b", None, (1, "a", (2.0, None)), rec, frozenset({1, 2})):
        assert frozen(v) and detached(v) is v
    for v in ([1], {"a": 1}, {1}, (1, [2]), Pair(1, [2]), np.zeros(2), Box(1)):
        assert not frozen(v)
        got = detached(v)
        assert got is not v and canon(got) == canon(v)


def test_an_element_that_cannot_be_copied_is_refused_with_one_line() -> None:
    import threading

    def driver() -> None:
        X = ap.dvector(2, name="X")
        X[0] = threading.Lock()

    with pytest.raises(ap.DDSError, match=r"^X: a DDS element is copied .* a lock cannot be"):
        ap.run(driver)


# ------------------------------------------------------------------ digests of objects
# Object elements are digested and compared (replica checks, dual tests) by text.  The
# ``repr`` of an object of a class without ``__repr__`` shows its address, which differs
# between processes: a DDS of such objects replayed as DIVERGED and dual-tested as FAIL
# though the program was deterministic.


class Plain:
    def __init__(self, n: Any, tags: Any = None) -> None:
        self.n, self.tags = n, tags


class Slots:
    __slots__ = ("a", "b")

    def __init__(self, a: Any) -> None:
        self.a = a


def _build(n: float, tag: str) -> Any:
    inner = Plain(n, {tag, "x"})
    cyc: list[Any] = [inner]
    cyc.append(cyc)  # a cycle
    return {"box": inner, "pair": (Slots(n), [Plain(-1)]), "cyc": cyc, "fn": len}


def test_objects_without_repr_compare_by_state_not_address() -> None:
    a, b = _build(1.5, "t"), _build(1.5, "t")
    assert stable_text(a) == stable_text(b) and " at 0x" not in stable_text(a)
    assert stable_text(_build(2.5, "t")) != stable_text(a)  # a number inside changed
    assert stable_text(_build(1.5, "u")) != stable_text(a)  # a set item changed
    c = _build(1.5, "t")
    c["pair"][0].a = 1.5000000000000002
    assert stable_text(c) != stable_text(a)


scalar_values = st.one_of(
    st.integers(), st.floats(allow_nan=False), st.text(max_size=3), st.none(), st.booleans()
)


def nested(leaves: Any, *objects: Callable[[Any], Any], max_leaves: int = 12) -> Any:
    """Lists, tuples, dicts and named tuples of ``leaves``, and what ``objects`` build."""
    return st.recursive(
        leaves,
        lambda kids: st.one_of(
            st.lists(kids, max_size=3),
            st.lists(kids, max_size=3).map(tuple),
            st.dictionaries(st.text(max_size=2), kids, max_size=3),
            st.builds(Pair, st.integers(), kids),
            *(make(kids) for make in objects),
        ),
        max_leaves=max_leaves,
    )


plain_values = nested(scalar_values)


@settings(max_examples=200, deadline=None)
@given(plain_values)
def test_values_whose_repr_shows_no_address_keep_it(v: Any) -> None:
    """So the digests of traces recorded before are unchanged."""
    assert stable_text(v) == repr(v)


def test_a_dds_of_plain_objects_passes_the_dual_tests() -> None:
    from replay import testing

    def driver() -> None:
        B = ap.create(N, lambda i: Plain(i, [i]), name="B")
        S = ap.dvector(N, shape=(), name="S")

        def body(j: int) -> None:
            b = B[j]
            S[j] = S[j] + b.n
            B[j] = Plain(b.n + 1, b.tags + [j])

        for _ in range(2):
            ap.async_for(0, N, body, name="b")
            ap.log_objective("s", float(S.gather().sum()))

    testing.assert_dual(driver, nodes=2, threads=2)
    ap.run(driver, nodes=3, test_mode=True)  # the replica check after every invocation


class Node:
    def __init__(self, value: int, nxt: Any = None) -> None:
        self.value, self.nxt = value, nxt


def test_a_long_chain_of_plain_objects_is_refused_with_one_line_not_a_crash() -> None:
    short: Any = None
    for k in range(100):
        short = Node(k, short)
    assert stable_text(short).count("Node(") == 100
    long: Any = None
    for k in range(5000):
        long = Node(k, long)

    with pytest.raises(
        ap.DDSError, match=r"of type Node is nested too deeply to be digested .* store it flatter"
    ):
        stable_text(long)

    def driver() -> None:
        ap.dvector(1, data=[long], name="L")

    with pytest.raises(ap.DDSError, match=r"^L: .* this Node is nested too deeply to be copied"):
        ap.run(driver)


# ------------------------------------------------------------------ exact texts
# A repr need not show the whole value: a numpy array's shows 8 digits and hides the
# middle of a long one, an object's own __repr__ may show only a name.  Before this, a
# DDS of dicts holding arrays digested two runs that differed in the 12th digit as
# equal, so a replay said "identical" and a dual test PASS where the bits differed.


class Named:
    """A class whose __repr__ shows its name only, as users write them."""

    def __init__(self, name: str, w: Any) -> None:
        self.name, self.w = name, w

    def __repr__(self) -> str:
        return f"Named({self.name!r})"


leaf_values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, width=32).map(np.float32),
    st.lists(st.floats(allow_nan=False), min_size=0, max_size=4).map(np.array),
    st.integers(1, 3).map(lambda k: np.linspace(0.0, 1.0, 700 * k)),  # summarised repr
    st.lists(st.integers(-5, 5), max_size=3).map(lambda x: np.array(x, dtype=np.int32)),
)
exact_values = nested(
    leaf_values,
    lambda kids: st.builds(Plain, kids, kids),
    lambda kids: st.builds(Named, st.text(max_size=2), kids),
    lambda kids: st.builds(Slots, kids),
    max_leaves=10,
)


def _leaves(v: Any, out: list[Callable[[], Any]], put: Callable[[Any], None]) -> None:
    """Every number, string or array inside ``v``, each as a function that changes it
    (or, where it cannot change in place, the holder) by the smallest step."""
    if isinstance(v, np.ndarray):
        if v.size:
            out.append(lambda: v.reshape(-1).__setitem__(v.size // 2, _next(v.flat[v.size // 2])))
        return
    if isinstance(v, (bool, type(None))) or (isinstance(v, (int, float, str, np.float32))):
        out.append(lambda: put(_next(v)))
        return
    if isinstance(v, list):
        for k, x in enumerate(v):
            _leaves(x, out, lambda new, k=k: v.__setitem__(k, new))
    elif isinstance(v, dict):
        for k, x in v.items():
            _leaves(x, out, lambda new, k=k: v.__setitem__(k, new))
    elif isinstance(v, tuple):  # rebuilt with the item changed
        rebuild = type(v)._make if hasattr(type(v), "_make") else tuple
        for k, x in enumerate(v):

            def put_item(new: Any, k: int = k) -> None:
                put(rebuild([*v[:k], new, *v[k + 1 :]]))

            _leaves(x, out, put_item)
    else:  # Plain, Named, Slots: their attributes
        for name in ("n", "tags", "w", "name", "a"):
            if hasattr(v, name):
                _leaves(getattr(v, name), out, lambda new, name=name: setattr(v, name, new))


def _next(x: Any) -> Any:
    """The value next to ``x``: one ulp nearer zero (a zero or an infinity: its sign
    flipped), one more, one character more, flipped."""
    if isinstance(x, np.floating):  # towards zero: never overflows
        return -x if np.isinf(x) or x == 0 else np.nextafter(x, 0, dtype=x.dtype)
    if isinstance(x, bool) or x is None:
        return not x
    if isinstance(x, float):
        return -x if x in (0.0, float("inf"), -float("inf")) else float(np.nextafter(x, 0.0))
    if isinstance(x, (int, np.integer)):
        return x + 1
    return x + "x"


@settings(max_examples=300, deadline=None)
@given(exact_values, st.data())
def test_the_text_of_an_element_changes_with_any_bit_of_its_value(v: Any, data: Any) -> None:
    """The text is a function of the value (a deep copy, made elsewhere in memory, has
    the same) and changes when any number anywhere in it moves by one ulp."""
    import copy

    box = [v]
    before = stable_text(box)
    assert stable_text(copy.deepcopy(box)) == before
    changes: list[Callable[[], Any]] = []
    _leaves(v, changes, lambda new: box.__setitem__(0, new))
    if not changes:
        return
    data.draw(st.sampled_from(changes))()
    assert stable_text(box) != before


def test_object_elements_holding_arrays_are_told_apart_by_every_verdict() -> None:
    """Digest, replica check and dual-test comparison see a one-ulp change inside an
    array inside a dict element (each said "equal" before)."""
    from engine.lowlevel import stable_text as public
    from replay._dualctl import comparable

    def values(eps: float) -> list[Any]:
        return [{"w": np.array([0.1 + eps, 0.2])}, Named("a", np.zeros(2000) + eps)]

    a, b = values(0.0), values(1e-15)

    def digest(vals: list[Any]) -> str:
        return ap.run(lambda: ap.dvector(2, data=vals, name="O").digest()).value

    assert digest(a) != digest(b) and digest(a) == digest(values(0.0))
    ca, cb = (comparable(np.array(v + [None], dtype=object)[:2]) for v in (a, b))
    assert (ca != cb).all() and public is stable_text
