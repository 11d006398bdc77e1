"""An ``async_for`` builds its schedule value only for a recorder that listens.

The failure classes: a recorder that is handed no value (its trace would miss grants and
messages), or an unrecorded run that pays for building one nobody reads (~130 us an
invocation).
"""

from __future__ import annotations

from typing import Any

import pytest

import engine as ap
from engine import Recorder
from engine.lowlevel import Schedule, Tape


class Keeping(Recorder):
    """A recorder that keeps the schedule values it is handed (and records nothing)."""

    def __init__(self) -> None:
        self.values: list[Schedule] = []

    def schedule_done(self, sched: Schedule) -> None:
        self.values.append(sched)
        super().schedule_done(sched)


def program() -> None:
    X = ap.dvector(8, shape=(2,), name="X")

    def body(j: int) -> None:
        X[j] = X[j] + j

    for _ in range(3):
        ap.async_for(0, 8, body, name="add")


@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 2)])
def test_only_a_listening_recorder_gets_schedule_values(
    nodes: int, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[Any] = []
    real = Tape.schedule

    def counted(self: Tape, *args: Any, **kw: Any) -> Schedule:
        built.append(args[:2])
        return real(self, *args, **kw)

    monkeypatch.setattr(Tape, "schedule", counted)
    keeping = Keeping()
    ap.run(program, nodes=nodes, threads=threads, recorder=keeping)
    assert [(s.op, s.invocation) for s in keeping.values] == [("add", i) for i in range(3)]
    assert built == [("add", i) for i in range(3)]
    built.clear()
    res = ap.run(program, nodes=nodes, threads=threads)  # the base recorder: nobody listens
    assert built == [] and len(res.digests) == 3
