"""The report of a chaos exploration: its runs, their outcome groups, the first failure.

An *outcome* is one hex digest over all of a run's DDS digests and logged objectives
(:func:`outcome_digest`); runs with the same outcome form a group.
"""

from __future__ import annotations

import hashlib
import shlex
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class ChaosRun:
    """One explored run: its number, the run id in the trace, its outcome digest, and
    what it produced (``digests``: (op, invocation, dds, digest); ``objectives``)."""

    run: int
    run_id: str
    outcome: str
    digests: list[tuple[str, int, str, str]]
    objectives: dict[str, list[float]]
    seconds: float = 0.0
    #: fault injection: where the node stopped, the trace's status of the run and what
    #: replaying it gave (None: no fault fired in this run)
    crash: dict[str, Any] | None = None

    def as_dict(self, seed: int, trace: str | None) -> dict[str, Any]:
        """The ``--json`` row: ``{run, seed, run_id, trace, outcome}``."""
        return {
            "run": self.run,
            "seed": seed,
            "run_id": self.run_id,
            "trace": trace,
            "outcome": self.outcome,
        }


@dataclass
class ChaosFailure:
    """The first run whose check failed (``location``: op, invocation, index when the
    check located a divergence)."""

    run: int
    seed: int
    check: str
    message: str
    run_id: str
    trace: str | None
    location: tuple[str, int, int] | None = None

    @property
    def replay_command(self) -> str | None:
        """The command that replays the failing run (None: it was not recorded)."""
        if self.trace is None:
            return None
        return f"replay single {_quoted(self.trace)} --run {self.run_id}"

    @property
    def break_command(self) -> str | None:
        """The replay command stopping in pdb at the first divergence (None: not located)."""
        if self.replay_command is None or self.location is None:
            return None
        op, inv, index = self.location
        return f"{self.replay_command} --break {shlex.quote(f'{op}:{inv}:{index}')}"

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` ``failed`` object."""
        return {
            "run": self.run,
            "seed": self.seed,
            "check": self.check,
            "message": self.message,
            "replay_command": self.replay_command,
        }


@dataclass
class ChaosReport:
    """What an exploration found: every run, the outcome groups and the first failure."""

    seed: int
    trace: str | None
    runs: list[ChaosRun] = field(default_factory=list)
    failed: ChaosFailure | None = None
    failures: int = 0
    wall_s: float = 0.0

    @property
    def groups(self) -> dict[str, list[int]]:
        """Outcome digest -> the run numbers that gave it (in first-seen order)."""
        out: dict[str, list[int]] = {}
        for r in self.runs:
            out.setdefault(r.outcome, []).append(r.run)
        return out

    @property
    def distinct(self) -> int:
        """How many distinct outcomes the runs had."""
        return len(self.groups)

    def spread(self) -> dict[str, list[tuple[float, float, float]]]:
        """Per objective, per iteration: (min, median, max) over the runs that logged it."""
        out: dict[str, list[tuple[float, float, float]]] = {}
        names = sorted({n for r in self.runs for n in r.objectives})
        for name in names:
            width = max(len(r.objectives.get(name, [])) for r in self.runs)
            rows = []
            for it in range(width):
                vals = np.asarray(
                    [
                        r.objectives[name][it]
                        for r in self.runs
                        if len(r.objectives.get(name, [])) > it
                    ],
                    dtype=np.float64,
                )
                rows.append((float(vals.min()), float(np.median(vals)), float(vals.max())))
            out[name] = rows
        return out

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` object: ``{runs, distinct, failed}``."""
        return {
            "runs": [r.as_dict(self.seed, self.trace) for r in self.runs],
            "distinct": self.distinct,
            "failed": None if self.failed is None else self.failed.as_dict(),
        }

    def lines(self) -> list[str]:
        """The human report."""
        out = [
            f"{len(self.runs)} chaos run(s) with chaos seed {self.seed}: "
            f"{self.distinct} distinct outcome(s) ({self.wall_s:.2f} s)"
        ]
        runs = {r.run: r for r in self.runs}
        for digest, members in self.groups.items():
            first = runs[members[0]]
            out.append(
                f"  outcome {digest[:16]}: {len(members)} run(s), first run {first.run} "
                f"(run id {first.run_id})"
            )
        for r in self.runs:
            if r.crash is not None:
                c = r.crash
                out.append(
                    f"  run {r.run}: node {c['node']} stopped in {c['op']}#{c['invocation']} "
                    f"after {c['after']} bodies; trace status {c['status']}, "
                    + (
                        "replayed up to the crash: identical"
                        if c.get("identical")
                        else f"replay: {c.get('replay', 'not recorded')}"
                    )
                )
        if self.distinct > 1:
            for name, rows in self.spread().items():
                out.append(f"  {name} per iteration (min / median / max):")
                for it, (lo, med, hi) in enumerate(rows):
                    out.append(f"    {it}: {lo:.6g} / {med:.6g} / {hi:.6g}")
        f = self.failed
        if f is not None:
            out.append(f"FAILED check {f.check} in run {f.run} (chaos seed {f.seed}): {f.message}")
            if self.failures > 1:
                out.append(f"  ({self.failures} run(s) failed in all)")
            if f.trace is not None:
                out.append(f"  trace: {f.trace}")
                out.append(f"  replay it: {f.replay_command}")
            if f.break_command is not None:
                out.append(f"  stop at the first divergence: {f.break_command}")
        return out


def _quoted(path: str) -> str:
    """``path`` as a shell word (JSON's quotes turned ``é`` into ``\\u00e9``, which no
    shell reads back)."""
    return shlex.quote(path)


# ====================================================================== outcome
def outcome_digest(
    digests: list[tuple[str, int, str, str]], objectives: dict[str, list[float]]
) -> str:
    """One hex digest over all of a run's DDS digests and objective values (by their bits)."""
    h = hashlib.blake2b(digest_size=16)
    for op, inv, dds, d in digests:
        h.update(f"d\0{op}\0{inv}\0{dds}\0{d}\n".encode())
    for name in sorted(objectives):
        h.update(f"o\0{name}\0".encode())
        for v in objectives[name]:
            h.update(struct.pack("<d", v))
    return h.hexdigest()


__all__ = ["ChaosFailure", "ChaosReport", "ChaosRun", "outcome_digest"]
