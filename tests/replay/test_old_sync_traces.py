"""Traces of sync_for recorded before updates went only to subscribers (issue 35 item 5)
still replay identically, in the cluster and in one process.

``tests/data/mlr_*.sqlite.gz`` were recorded on commit 39f82f3 (every node got every
update and an 8-byte message for every empty one) with ``replay run mlr -p
synthetic=true -p epochs=1`` on 2 ranks (BSP) and on 3 ranks with ``-p sync=ssp``; they
are stored compressed (each SQLite file is 200 KiB, mostly schema pages).  ``mlr``'s source
file has changed since (it returns its model), so they replay with ``--allow-changed-code``:
the digests and objectives must still match bit for bit.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests import cli as tcli

DATA = Path(__file__).parent.parent / "data"


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["mlr_bsp_2", "mlr_ssp_3"])
@pytest.mark.parametrize("mode", ["cluster", "single"])
def test_a_trace_recorded_before_routing_replays_identically(
    tmp_path: Path, name: str, mode: str
) -> None:
    trace = tmp_path / f"{name}.sqlite"
    trace.write_bytes(gzip.decompress((DATA / f"{name}.sqlite.gz").read_bytes()))
    proc = tcli.invoke([mode, trace, "--json", "--allow-changed-code"])
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["identical"] is True and res["first_difference"] is None, res
    assert res["checked"] == {"digests": 2, "objectives": 2}


@pytest.mark.parametrize("name", ["mlr_bsp_2", "mlr_ssp_3"])
def test_a_trace_recorded_before_routing_verifies(tmp_path: Path, name: str, cli) -> None:
    """Its hash chains still check: the chain digests each row's columns in the schema's
    order, so a schema that reordered or retyped a column would fail here."""
    trace = tmp_path / f"{name}.sqlite"
    trace.write_bytes(gzip.decompress((DATA / f"{name}.sqlite.gz").read_bytes()))
    proc = cli("verify", str(trace))
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout.lower(), proc.stdout
