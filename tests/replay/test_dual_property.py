"""Property-based dual tests over generated programs, and proof that they catch mutants.

The properties run the hypothesis profile's ``max_examples`` (``ci``: 200 each) on
in-process clusters; a few generated programs also run their parallel side under
``mpiexec -n 2`` and ``-n 3`` (``mpi_dual.py``).  Each engine mutant
(``tests/mutants.py``) must make the same property fail within a bounded number of
generated examples, with a report that names the diverging operator and invocation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, note, settings
from hypothesis import strategies as st

from replay import strategies as rs
from replay.testing import DualResult
from tests import mutants
from tests.conftest import run_mpi

HERE = Path(__file__).parent
NAMESPACE = {name: getattr(rs, name) for name in rs.__all__}

#: Generated examples a mutant hunt may use before the test fails (it stops at the first
#: failing one).  Each costs ~25 ms; the rarest mutants (stale_prefetch, wrong_lock_order)
#: fail ~5% of default examples once hypothesis moves past its small first examples, and
#: 20 hunts each needed at most ~180, so 1000 leaves no realistic chance of a miss.
MUTANT_EXAMPLES = 1000
#: The same for the sync_for mutants (reorder_aggregation needs >= 3 nodes adding to one row).
SYNC_MUTANT_EXAMPLES = 400
#: Cases per mpiexec run (each run pays ~2 s of start-up; each case well under 1 s).
MPI_CASES = 6

#: A regression kept from a mutant hunt (skip_writeback, as hypothesis shrank it): with
#: 2 nodes the one element of T0 belongs to node 1, but the forward plan runs its only
#: body on node 0, so the write must travel back to its owner.
REGRESSION = rs.Case(
    program=rs.Program(
        tables=(rs.Table(size=1, width=1),),
        loops=(rs.AsyncLoop(bodies=(rs.Access(reads=(), writes=((0, 0, "lerp"),)),)),),
    ),
    shape=rs.Shape(nodes=2, threads=1),
)


def _failures(results: dict[str, DualResult]) -> list[DualResult]:
    return [r for r in results.values() if not r.passed]


def _assert_passes(case: rs.Case) -> None:
    note(repr(case))
    failed = _failures(rs.check(case))
    assert not failed, "\n".join([repr(case), *(r.report() for r in failed)])


# ====================================================================== properties
@example(REGRESSION)
@given(rs.cases())
def test_parallel_equals_serial_for_random_programs(case: rs.Case) -> None:
    _assert_passes(case)


@given(
    rs.cases(
        programs=rs.programs(kinds=("async",), max_tables=1, max_size=6, max_bodies=24),
        shapes=st.builds(rs.Shape, nodes=st.integers(1, 2), threads=st.integers(2, 3)),
    )
)
def test_parallel_equals_serial_when_hot_groups_split_under_locks(case: rs.Case) -> None:
    _assert_passes(case)


@given(rs.cases(programs=rs.programs(kinds=("sync",))))
def test_parallel_equals_serial_for_sync_for_programs(case: rs.Case) -> None:
    _assert_passes(case)


@settings(max_examples=50)
@given(rs.cases())
def test_descriptions_are_valid_python(case: rs.Case) -> None:
    assert eval(repr(case), NAMESPACE) == case  # noqa: S307 - our own repr


def test_descriptions_reject_out_of_range_accesses() -> None:
    with pytest.raises(ValueError, match="outside"):
        rs.Program(tables=(rs.Table(2),), loops=(rs.AsyncLoop((rs.Access(reads=((0, 5),)),)),))
    with pytest.raises(ValueError, match="unknown op"):
        rs.Access(writes=((0, 0, "pow"),))


# ====================================================================== mutants
class _Caught(Exception):
    """Stops a mutant hunt at its first failing case."""


def _hunt(
    mutant: str, cases: st.SearchStrategy[rs.Case], budget: int
) -> tuple[rs.Case, dict[str, DualResult]] | None:
    """The first generated case whose dual test fails with ``mutant`` active."""
    found: list[tuple[rs.Case, dict[str, DualResult]]] = []

    @settings(
        max_examples=budget,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(cases)
    def search(case: rs.Case) -> None:
        if not found:
            results = rs.check(case)
            if not _failures(results):
                return
            found.append((case, results))
        raise _Caught()  # also when hypothesis replays the failing case: never flaky

    with mutants.active(mutant):
        try:
            search()
        except _Caught:
            pass
    assert not mutants.ACTIVE
    return found[0] if found else None


def _assert_caught(
    mutant: str, cases: st.SearchStrategy[rs.Case] | None = None, budget: int = MUTANT_EXAMPLES
) -> None:
    got = _hunt(mutant, cases if cases is not None else rs.cases(), budget)
    assert got is not None, f"{mutant}: no failure in {budget} generated programs"
    case, results = got
    print(f"{mutant} caught by {case!r}")
    for r in _failures(results):
        d = r.divergence or {}
        text = r.report()
        print(text)
        assert d.get("op") and d.get("invocation") is not None, text
        assert f"op {d['op']}, invocation {d['invocation']}" in text
        if d.get("what") == "replica":  # checked after every invocation in test mode
            assert d["replica"] != d["owner_value"] and "replica" in text, text
        elif "element" in d:  # localised: both values are shown
            assert d["serial"] != d["parallel"], text


@pytest.mark.parametrize(
    "mutant", ["skip_writeback", "stale_prefetch", "wrong_lock_order", "drop_barrier"]
)
def test_property_catches_async_for_mutant(mutant: str) -> None:
    _assert_caught(mutant)


@pytest.mark.parametrize("mutant", ["aggregate_twice", "reorder_aggregation"])
def test_property_catches_sync_for_mutant(mutant: str) -> None:
    # Reversing two summands is exact (IEEE addition commutes), so a reordered sum of the
    # nodes' deltas only shows on 3 nodes: hunt there, not on shapes that cannot show it.
    three = st.builds(rs.Shape, nodes=st.just(3), threads=st.integers(1, 2))
    shapes = three if mutant == "reorder_aggregation" else None
    sync_only = rs.cases(programs=rs.programs(kinds=("sync",), syncs=("bsp",)), shapes=shapes)
    _assert_caught(mutant, sync_only, budget=SYNC_MUTANT_EXAMPLES)


def test_a_caught_mutant_shrinks_to_a_small_pasteable_case() -> None:
    """skip_writeback is deterministic: hypothesis shrinks its counterexample."""
    seen: list[rs.Case] = []

    @settings(max_examples=200, database=None, deadline=None, report_multiple_bugs=False)
    @given(rs.cases(programs=rs.programs(kinds=("async",)), shapes=st.just(rs.Shape(2, 1))))
    def prop(case: rs.Case) -> None:
        seen.append(case)
        _assert_passes(case)

    with mutants.active("skip_writeback"), pytest.raises(AssertionError):
        prop()
    minimal = seen[-1]  # hypothesis re-runs the shrunk example last
    assert sum(len(loop.bodies) for loop in minimal.program.loops) <= 3, repr(minimal)
    pasted = eval(repr(minimal), NAMESPACE)  # noqa: S307 - our own repr
    with mutants.active("skip_writeback"):
        assert _failures(rs.check(pasted))
    assert not _failures(rs.check(pasted))


def test_mutant_switch_is_scoped_and_checked() -> None:
    with pytest.raises(ValueError, match="unknown mutant"):
        with mutants.active("no_such_bug"):
            pass
    with pytest.raises(KeyError), mutants.active("drop_barrier"):
        assert mutants.ACTIVE == {"drop_barrier"}
        raise KeyError("inside")
    assert not mutants.ACTIVE
    for owner, attr, broken in mutants.MUTANTS.values():  # every real step is back
        assert getattr(owner, attr) is not broken


# ====================================================================== MPI
def _draw(cases: st.SearchStrategy[rs.Case], k: int) -> list[rs.Case]:
    got: list[rs.Case] = []

    @settings(max_examples=k, database=None, deadline=None, phases=[Phase.generate])
    @given(cases)
    def collect(case: rs.Case) -> None:
        got.append(case)

    collect()
    return got


@pytest.mark.parametrize("ranks", [2, 3])
def test_generated_programs_under_mpiexec(ranks: int, tmp_path: Path) -> None:
    # hypothesis draws the simplest case first; the dual tests above cover it
    cases = _draw(rs.cases(shapes=rs.shapes(max_nodes=1, max_threads=2)), MPI_CASES + 1)[1:]
    cases = [rs.Case(c.program, rs.Shape(ranks, c.shape.threads), c.order, c.seed) for c in cases]
    path = tmp_path / "cases.txt"
    path.write_text("".join(repr(c) + "\n" for c in cases))
    proc = run_mpi([str(HERE / "mpi_dual.py"), str(path)], ranks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(cases)
    for r in results:
        assert r["digests"] > 0
        assert r["forward"] is None and r["backward"] is None, json.dumps(r, indent=1)
