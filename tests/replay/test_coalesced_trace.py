"""Runs record whether their routed rows travelled coalesced (run label
``coalesced_sends``) and relayed along the ring (``ring_routes``, with rotations that
move the smaller space), and a replay plans and sends them as the run did.

The digests are the same bits either way, but a trace's routed arrivals (source,
exchange number, size per message) are what its timeline, ``show`` and ``verify`` read,
and a replay recorded with ``--trace-out`` should receive what the run received.  A
trace without the label was recorded before coalescing (one message per round and
pair): its replay sends so too.  Here such a trace is made by recording with
``coalesce=False``, which is what runs did until 2026-12-06, and one from before ring
routes with ``ring=False`` (until 2026-12-07; its plans differ too, so a replay that
planned as runs do now would diverge at its first plan).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tracer
from replay import _replay as rp
from replay._job import COALESCE_LABEL, RING_LABEL, run_here

SGDMF = ["synthetic=true", "epochs=2", "synthetic_ratings=2000", "rank=4"]


def _record(path: Path, coalesce: bool, ring: bool = True) -> None:
    spec = {
        "app": "sgdmf",
        "params": SGDMF,
        "nodes": 4,
        "trace": str(path),
        "coalesce": coalesce,
        "ring": ring,
    }
    run_here(spec)


def _arrivals(trace: Path) -> tuple[list[list[tuple[object, ...]]], dict[str, object]]:
    """Per node: the messages it received, as (channel, source, exchange, bytes), and
    (schema 7) its routed write-backs as ("routed", op, invocation, exchange, how many,
    bytes); and the run's labels."""
    with tracer.open(trace) as store:
        run = store.run()
        out: list[list[tuple[object, ...]]] = []
        for node in range(run.info.ranks):
            m = run.messages(node)
            rows: list[tuple[object, ...]] = list(
                zip(
                    m.channel.tolist(),
                    m.source.tolist(),
                    m.source_seq.tolist(),
                    m.nbytes.tolist(),
                    strict=True,
                )
            )
            out.append(rows)
        for rc in run.routed():
            cols = (rc.exchange.tolist(), rc.count.tolist(), rc.nbytes.tolist())
            for ex, k, n in zip(*cols, strict=True):
                out[rc.node].append(("routed", rc.op, rc.invocation, ex, k, n))
        labels = dict(run.info.labels or {})
    return [sorted(per, key=repr) for per in out], labels


@pytest.mark.parametrize(
    ("coalesce", "ring"),
    [(False, False), (True, False), (True, True)],
    ids=["before", "coalesced", "ring"],
)
def test_a_replay_receives_the_messages_its_run_received(
    tmp_path: Path, coalesce: bool, ring: bool
) -> None:
    trace, again = tmp_path / "t.sqlite", tmp_path / "again.sqlite"
    _record(trace, coalesce, ring)
    spec = {"mode": "single", "trace": str(trace), "out_trace": str(again)}
    assert rp.replay_here(spec)["identical"] is True
    (want, labels), (got, relabels) = _arrivals(trace), _arrivals(again)
    assert bool(labels.get(COALESCE_LABEL)) is coalesce and relabels == labels
    assert bool(labels.get(RING_LABEL)) is ring
    assert got == want


def test_coalesced_runs_receive_fewer_messages_with_the_same_rows(tmp_path: Path) -> None:
    """What the label tells apart: the same rows, in fewer (larger) messages."""
    old, new = tmp_path / "old.sqlite", tmp_path / "new.sqlite"
    _record(old, False, ring=False)
    _record(new, True, ring=False)
    (a, _), (b, _) = _arrivals(old), _arrivals(new)

    def routed(per_node: list[list[tuple[object, ...]]], k: int) -> int:
        return sum(int(r[k]) for per in per_node for r in per if r[0] == "routed")  # type: ignore[call-overload]

    assert 0 < routed(b, 4) < routed(a, 4)  # messages
    assert routed(b, 5) == routed(a, 5)  # their bytes
