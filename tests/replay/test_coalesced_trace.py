"""Runs record whether their routed rows travelled coalesced (run label
``coalesced_sends``), and a replay sends them as the run did.

The digests are the same bits either way, but a trace's routed arrivals (source,
exchange number, size per message) are what its timeline, ``show`` and ``verify`` read,
and a replay recorded with ``--trace-out`` should receive what the run received.  A
trace without the label was recorded before coalescing (one message per round and
pair): its replay sends so too.  Here such a trace is made by recording with
``coalesce=False``, which is what runs did until 2026-12-06.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tracer
from replay import _replay as rp
from replay._job import COALESCE_LABEL, run_here

SGDMF = ["synthetic=true", "epochs=2", "synthetic_ratings=2000", "rank=4"]


def _record(path: Path, coalesce: bool) -> None:
    spec = {"app": "sgdmf", "params": SGDMF, "nodes": 4, "trace": str(path), "coalesce": coalesce}
    run_here(spec)


def _arrivals(trace: Path) -> list[list[tuple[str, int, int, int]]]:
    """Per node: the messages it received, as (channel, source, exchange, bytes)."""
    with tracer.open(trace) as store:
        run = store.run()
        out = []
        for node in range(run.info.ranks):
            m = run.messages(node)
            rows = zip(
                m.channel.tolist(),
                m.source.tolist(),
                m.source_seq.tolist(),
                m.nbytes.tolist(),
                strict=True,
            )
            out.append(sorted(rows))
        labels = dict(run.info.labels or {})
    return out, labels


@pytest.mark.parametrize("coalesce", [False, True], ids=["before", "coalesced"])
def test_a_replay_receives_the_messages_its_run_received(tmp_path: Path, coalesce: bool) -> None:
    trace, again = tmp_path / "t.sqlite", tmp_path / "again.sqlite"
    _record(trace, coalesce)
    spec = {"mode": "single", "trace": str(trace), "out_trace": str(again)}
    assert rp.replay_here(spec)["identical"] is True
    (want, labels), (got, relabels) = _arrivals(trace), _arrivals(again)
    assert bool(labels.get(COALESCE_LABEL)) is coalesce and relabels == labels
    assert got == want


def test_coalesced_runs_receive_fewer_messages_with_the_same_rows(tmp_path: Path) -> None:
    """What the label tells apart: the same rows, in fewer (larger) messages."""
    old, new = tmp_path / "old.sqlite", tmp_path / "new.sqlite"
    _record(old, False)
    _record(new, True)
    (a, _), (b, _) = _arrivals(old), _arrivals(new)
    assert sum(map(len, b)) < sum(map(len, a))
    assert sum(n for per in b for *_, n in per) == sum(n for per in a for *_, n in per)
