"""Distributed data structures: access rules, partitioning, gathers, digests."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import engine as ap
from tests import mpibatch


def in_cluster(nodes: int, fn, threads: int = 1):
    return ap.run(fn, nodes=nodes, threads=threads).value


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_dvector_rows_are_copies_and_writes_go_through_assignment(nodes: int) -> None:
    def prog():
        W = ap.dvector(5, shape=(3,), init=ap.init.constant(1.0), name="W")
        row = W[2]
        row[0] = 99.0  # changing the returned row never changes the DDS
        assert W[2][0] == 1.0
        W[2] += 2.0  # augmented assignment works
        W[4] = [7.0, 8.0, 9.0]
        return W.gather()

    got = in_cluster(nodes, prog)
    assert got.shape == (5, 3)
    assert got[2].tolist() == [3.0, 3.0, 3.0]
    assert got[4].tolist() == [7.0, 8.0, 9.0]
    assert got[0].tolist() == [1.0, 1.0, 1.0]


def test_dvector_partitioning_is_contiguous_ranges() -> None:
    def prog():
        X = ap.dvector(10, shape=(), name="X")
        return [X.owner(i) for i in range(10)], [X.owned(p).tolist() for p in range(3)]

    owners, owned = in_cluster(3, prog)
    assert owners == sorted(owners)
    assert sorted(sum(owned, [])) == list(range(10))
    assert max(len(o) for o in owned) - min(len(o) for o in owned) <= 1


def test_dvector_of_objects_len_iter_and_errors() -> None:
    def prog():
        A = ap.dvector(3, data=[("a", 1), ("b", 2), ("c", 3)], name="A")
        assert len(A) == 3
        assert list(A) == [("a", 1), ("b", 2), ("c", 3)]
        assert A[-1] == ("c", 3)
        with pytest.raises(ap.DDSError, match=r"A: index 3 out of range for length 3"):
            A[3]
        with pytest.raises(ap.DDSError, match="must be an integer"):
            A["x"]
        return A.gather()

    got = in_cluster(2, prog)
    assert got.dtype == object and got[1] == ("b", 2)


def test_dvector_shape_mismatch_is_reported() -> None:
    def prog():
        W = ap.dvector(2, shape=(3,), name="W")
        with pytest.raises(ap.DDSError, match=r"shape \(2,\).*shape \(3,\)"):
            W[0] = [1.0, 2.0]

    in_cluster(1, prog)


def test_duplicate_names_are_rejected() -> None:
    def prog():
        ap.dvector(2, shape=(), name="W")
        with pytest.raises(ap.SessionError, match="'W' already exists"):
            ap.dvector(2, shape=(), name="W")

    in_cluster(1, prog)


@pytest.mark.parametrize("nodes", [1, 3])
def test_dmap_hash_partitioned_read_write(nodes: int) -> None:
    def prog():
        M = ap.dmap(shape=(2,), keys=["x", "y", 7], name="M")
        M["z"] = [1.0, 2.0]
        M["x"] += 1.0
        assert "z" in M and "nope" not in M
        with pytest.raises(ap.DDSError, match="no key 'nope'"):
            M["nope"]
        owners = {k: M.owner(k) for k in M}
        return M.keys(), M.gather(), owners

    keys, vals, owners = in_cluster(nodes, prog)
    assert keys == ["x", "y", 7, "z"]
    assert vals[0].tolist() == [1.0, 1.0] and vals[3].tolist() == [1.0, 2.0]
    assert set(owners.values()) <= set(range(nodes))
    assert owners[7] == 7 % nodes  # integer keys hash to themselves: stable across processes


def test_dmap_rejects_insertion_inside_a_loop_body() -> None:
    def prog():
        M = ap.dmap(shape=(), keys=[0, 1], name="M")

        def body(j):
            M[j + 10] = 1.0

        with pytest.raises(ap.EngineError, match="cannot insert key 10 inside a loop body"):
            ap.async_for(0, 2, body, name="ins")

    in_cluster(1, prog)


def test_dmultimap_appends_tuples() -> None:
    def prog():
        M = ap.dmultimap(name="M")
        M.add("a", 1)
        M.add("a", 2)
        M.add("b", 3)
        M["b"] += (4,)
        return dict(M.items())

    assert in_cluster(2, prog) == {"a": (1, 2), "b": (3, 4)}


def test_digest_depends_on_content_not_on_cluster_size() -> None:
    def prog():
        W = ap.dvector(6, shape=(2,), init=ap.init.normal(0, 1), name="W")
        d0 = W.digest()
        W[1] = [0.0, 0.0]
        return d0, W.digest(), W.gather()

    a = ap.run(prog, nodes=1, seed=3).value
    b = ap.run(prog, nodes=3, seed=3).value
    assert a[0] == b[0] and a[1] == b[1] and a[0] != a[1]
    assert np.array_equal(a[2], b[2])
    c = ap.run(prog, nodes=1, seed=4).value
    assert c[0] != a[0]  # init is seeded by (run seed, name)


def test_a_dvectors_owned_runs_are_its_owned_slots() -> None:
    # the digest reads a dvector's runs from its bounds, not from owned(): they must agree
    from engine._runtime.transport import _owned_runs

    def prog(n: int, nodes: int) -> None:
        v = ap.dvector(n, shape=(2,), name="v")
        runs = _owned_runs(v, nodes)
        assert runs is not None and len(runs) == nodes
        for p, (lo, hi) in enumerate(runs):
            assert np.array_equal(np.arange(lo, hi), v.owned(p)), (n, nodes, p)

    for nodes in (1, 2, 3, 5):
        for n in (0, 1, 2, 3, 7, 100):
            ap.run(prog, {"n": n, "nodes": nodes}, nodes=nodes)


DIGESTS = ["xxh3-chunks", "xxh3-128", "blake2b-128"]


@pytest.fixture(scope="module")
def digest_mpi(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, mpibatch.Batch]:
    """tests/engine/mpi_digest.py for each selected hash on 2 and 3 ranks: one launch per
    rank count."""
    tmp = tmp_path_factory.mktemp("digest-mpi")
    batches = {n: mpibatch.Batch(n, tmp / str(n)) for n in (2, 3)}
    test = test_digests_follow_their_definition_in_process_and_under_mpi
    for batch in batches.values():
        for p in mpibatch.selected(request, test):
            batch.add(p["kind"], Path(__file__).parent / "mpi_digest.py", p["kind"])
    return batches


@pytest.mark.parametrize("kind", DIGESTS)
def test_digests_follow_their_definition_in_process_and_under_mpi(
    kind: str, monkeypatch: pytest.MonkeyPatch, digest_mpi: dict[int, mpibatch.Batch]
) -> None:
    # the digest is the run's hash of the head and the gathered array's bytes; the
    # in-process cluster hashes the owners' runs in place and MPI gathers raw rows to
    # rank 0, so every placement must give the definition's value (and every rank)
    sys.path.insert(0, str(Path(__file__).parent))
    import mpi_digest

    monkeypatch.setattr(mpi_digest, "KIND", kind)
    seen = {repr(ap.run(mpi_digest.prog, nodes=n, digest=kind).value) for n in (1, 2, 3)}
    assert len(seen) == 1
    want = ",".join(ap.run(mpi_digest.prog, nodes=1, digest=kind).value)
    assert want.startswith("x3:") == (kind == "xxh3-128")
    assert want.startswith("xc:") == (kind == "xxh3-chunks")
    for ranks in (2, 3):
        proc = digest_mpi[ranks].result(kind)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("OK")]
        assert lines == [f"OK {want}"], proc.stdout


def test_a_run_digests_with_xxh3_chunks_unless_told_and_refuses_unknown_hashes() -> None:
    def prog() -> str:
        return ap.dvector(3, shape=(), name="v").digest()

    assert ap.run(prog).value.startswith("xc:")
    assert ap.run(prog, digest="xxh3").value.startswith("x3:")
    assert len(ap.run(prog, digest="blake2b").value) == 32
    with pytest.raises(ValueError, match="unknown digest hash 'md5'"):
        ap.run(prog, digest="md5")
