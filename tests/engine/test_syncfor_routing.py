"""sync_for routing (issue 35 item 5): the same bits as before, fewer messages.

``EXPECTED`` holds fingerprints (the DDS digests of every invocation and the final
parameter values) of the sync_for programs of ``tests/engine/mpi_routing.py``, recorded
on commit 39f82f3, before updates were sent only to subscribers: BSP, SSP (in step and
under seeded delays) and Hybrid, on 1, 2, 3 and 8 in-process nodes.  Routing must not
change a bit of any of them, in process or under ``mpiexec`` (the programs whose result
does not depend on timing).  Regenerate (only when the arithmetic is meant to change)
with ``python -m tests.engine.test_syncfor_routing``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import engine as ap
from tests import mpibatch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from mpi_routing import PROGRAMS, _sparse, fingerprint, mpi_names  # noqa: E402

EXPECTED: dict[str, str] = {
    "ls-bsp-p1": "696ce04f0739aca5650bd6da",
    "ls-bsp-p2": "858cf2f65aed7791531f4e28",
    "ls-bsp-p3": "fe72215daa95ac36e10d4f05",
    "ls-bsp-p8": "cadb40c9220547dcc96ff0dc",
    "ls-hybrid-p1": "696ce04f0739aca5650bd6da",
    "ls-hybrid-p2": "858cf2f65aed7791531f4e28",
    "ls-hybrid-p3": "fe72215daa95ac36e10d4f05",
    "ls-hybrid-p8": "cadb40c9220547dcc96ff0dc",
    "ls-ssp-p1": "696ce04f0739aca5650bd6da",
    "ls-ssp-p2": "dae5e4b06732d26ed3306ac7",
    "ls-ssp-p3": "42b0d0837c7c0569d73e73e9",
    "ls-ssp-p8": "ae456327491d31060a2b7711",
    "mlr-bsp-p1": "8cadd81b6335d6a8fdaf7557",
    "mlr-bsp-p2": "150067622307cfd4676820d9",
    "mlr-bsp-p3": "307ce62eee408f873f2c8bd8",
    "mlr-bsp-p8": "b525d950de301348f27429c4",
    "mlr-hybrid-p1": "8cadd81b6335d6a8fdaf7557",
    "mlr-hybrid-p2": "150067622307cfd4676820d9",
    "mlr-hybrid-p3": "307ce62eee408f873f2c8bd8",
    "mlr-hybrid-p8": "b525d950de301348f27429c4",
    "mlr-ssp-p1": "8cadd81b6335d6a8fdaf7557",
    "mlr-ssp-p2": "b4098f9e68b078c0670ed37f",
    "mlr-ssp-p3": "34bcabd309e195eb757f5a88",
    "mlr-ssp-p8": "ac09753758c769b4c67e3207",
    "mlr-ssp-t2-p2": "140bfd8f973ad838fab9f1ae",
    "mlr-ssp-t2-p3": "5dbcdf8628ebafd06996fca2",
    "sgd-bsp-p1": "05fb8d0fb37e237a9c9f2b10",
    "sgd-bsp-p2": "0c7941824c570fff94bc2fb3",
    "sgd-bsp-p3": "b2f675aeec6c7a552083d0fb",
    "sgd-bsp-p8": "e4695d2aabc9b2481c1fa44b",
    "sgd-bsp-t2-p2": "5b6b6daf5f244e54b41e950d",
    "sgd-bsp-t2-p3": "6c338065f7b2514ecfca803b",
    "sgd-hybrid-p1": "05fb8d0fb37e237a9c9f2b10",
    "sgd-hybrid-p2": "0c7941824c570fff94bc2fb3",
    "sgd-hybrid-p3": "b2f675aeec6c7a552083d0fb",
    "sgd-hybrid-p8": "e4695d2aabc9b2481c1fa44b",
    "sgd-hybrid-t2-p2": "127d9569cc2fe29c302d0b4c",
    "sgd-hybrid-t2-p3": "40c2124a12f41acbdf0a7042",
    "sgd-ssp-delays-p1": "05fb8d0fb37e237a9c9f2b10",
    "sgd-ssp-delays-p2": "4cd41ba245cd668bf150ba97",
    "sgd-ssp-delays-p3": "b583a48b36e39a7b6bdfafb3",
    "sgd-ssp-delays-p8": "3064d6e55acb4d2cfa89971b",
    "sgd-ssp-p1": "05fb8d0fb37e237a9c9f2b10",
    "sgd-ssp-p2": "6f5b0c693dc4709ca76d834b",
    "sgd-ssp-p3": "20030741ed35bd34a340d7ba",
    "sgd-ssp-p8": "28c7eb7060469c18f682a681",
    "sgd-whole-p2": "0c7941824c570fff94bc2fb3",
    "sgd-whole-p3": "b2f675aeec6c7a552083d0fb",
    "sparse-bsp-p1": "ba63884b489b8ee922a62189",
    "sparse-bsp-p2": "989eed92874f467f36c050c4",
    "sparse-bsp-p3": "fdec7dc5cfc059664bfd6e75",
    "sparse-bsp-p8": "b8ac6c5acb1c398854589ef5",
    "sparse-hybrid-p1": "ba63884b489b8ee922a62189",
    "sparse-hybrid-p2": "989eed92874f467f36c050c4",
    "sparse-hybrid-p3": "fdec7dc5cfc059664bfd6e75",
    "sparse-hybrid-p8": "b8ac6c5acb1c398854589ef5",
    "sparse-ssp-delays-p1": "ba63884b489b8ee922a62189",
    "sparse-ssp-delays-p2": "50eb9fa431ccbea21b147f51",
    "sparse-ssp-delays-p3": "9a13d8f164d7bfdb36f2e215",
    "sparse-ssp-delays-p8": "865665f2ba92d5fce14bc76d",
    "sparse-ssp-p1": "ba63884b489b8ee922a62189",
    "sparse-ssp-p2": "89e537a9924d2bbdc4ed337a",
    "sparse-ssp-p3": "712be3b7128703e2dc3ae511",
    "sparse-ssp-p8": "1d3bf2a8c18830849b2364a9",
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_digests_are_those_of_the_replicated_broadcast(name: str) -> None:
    assert fingerprint(name) == EXPECTED[name]


@pytest.fixture(scope="module")
def routing_mpi(tmp_path_factory: pytest.TempPathFactory) -> dict[int, mpibatch.Batch]:
    """tests/engine/mpi_routing.py on 2 and 3 ranks (one launch each)."""
    tmp = tmp_path_factory.mktemp("routing-mpi")
    batches = {n: mpibatch.Batch(n, tmp / str(n)) for n in (2, 3)}
    for b in batches.values():
        b.add("routing", HERE / "mpi_routing.py")
    return batches


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_mpi_runs_route_to_the_same_bits(ranks: int, routing_mpi: dict) -> None:
    proc = routing_mpi[ranks].result("routing")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = mpi_names(ranks)
    assert len(names) == 10  # BSP (1 and 2 threads, re=False), Hybrid on one thread
    for got in routing_mpi[ranks].values("routing"):
        assert got == {n: EXPECTED[n] for n in names}


if __name__ == "__main__":
    print("EXPECTED: dict[str, str] = {")
    for n in sorted(PROGRAMS):
        print(f"    {n!r}: {fingerprint(n)!r},")
    print("}")


class _Messages(ap.Recorder):
    """The sync_for messages nodes received: (node, channel, source, clock, payload bytes)."""

    def __init__(self) -> None:
        self.got: list[tuple[int, str, int, int, int]] = []

    def message_received(self, node: int, channel: str, source: int, seq: int, nbytes: int) -> None:
        self.got.append((node, channel, source, seq, nbytes))


@pytest.mark.parametrize("sync", ["bsp", "ssp", "hybrid"])
def test_no_message_is_empty_and_updates_carry_fewer_rows(sync: str) -> None:
    log = _Messages()
    inner = _sparse(sync)

    def prog() -> Any:
        inner()
        return ap.current().ops["sync_for:sparse"].layout

    res = ap.run(prog, nodes=8, recorder=log)
    lay = res.value
    assert log.got and all(nbytes > 0 for *_, nbytes in log.got)
    updates = [m for m in log.got if m[1] == "sync_for.update"]
    # what the broadcast sent in 2 invocations: every owner's new rows to the 7 others,
    # every clock (and a bare stamp when it had none)
    rows = [lay.owner(c, o).nrows[0] for c in range(lay.clocks) for o in range(8)]
    assert len(updates) < 2 * 7 * len(rows)
    assert sum(m[4] for m in updates) < 0.6 * 2 * 7 * 32 * sum(rows)  # measured: 0.51-0.52


def test_mlr_at_64_nodes_sends_at_most_1300_messages_per_clock() -> None:
    from apps.mlr._app import train

    seen: dict[str, int] = {}

    def prog() -> None:
        before = ap.current().cluster.traffic.snapshot()
        train(epochs=1)
        after = ap.current().cluster.traffic.snapshot()
        seen.update({k: after[k] - before[k] for k in after})

    res = ap.run(prog, nodes=64)
    clocks = res.planner["mlr"]["rounds"]
    assert clocks == 3
    assert seen["received_messages"] == seen["sent_messages"] <= 1300 * clocks  # was 8,064
    assert seen["received_bytes"] == seen["sent_bytes"]
