"""What a dual verdict did not test: the relaxations test mode turned off.

Test mode runs a relaxed DDS as an ordinary one and an SSP ``sync_for`` with staleness 0
(BSP), because exact equivalence is impossible otherwise (DESIGN.md §5, §8).  So a PASS
says nothing about the program as declared: a relaxed dvector used as an exact counter
over-counts in a real run, an SSP loss differs.  The engine reports each such DDS and
operator (``engine.RunResult.ran_exact``); this module turns the report into the words of
the verdict, its JSON and the way to check a property under the real execution.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: What test mode ran in place of each declared kind (the ``tested_as`` of a JSON entry).
TESTED_AS = {"relaxed": "exact", "ssp": "bsp"}


class UntestedWarning(UserWarning):
    """A dual test passed, but ran a relaxed DDS exactly or an SSP operator as BSP."""


def not_tested(*reports: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries of the engine's ``ran_exact`` reports, once each, in the order met,
    with what they were tested as: ``{"kind", "name", "tested_as"[, "staleness"]}``."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for report in reports:
        for e in report:
            key = (str(e["kind"]), str(e["name"]))
            if key not in out:
                out[key] = {**e, "tested_as": TESTED_AS.get(key[0], "exact")}
    return list(out.values())


def phrase(entries: list[dict[str, Any]]) -> str:
    """``relaxed DDS 'claims' tested exact; SSP 'fit' tested as BSP: staleness not
    covered`` ("" for no entries)."""
    relaxed = [e["name"] for e in entries if e["kind"] == "relaxed"]
    ssp = [e["name"] for e in entries if e["kind"] == "ssp"]
    parts = []
    if relaxed:
        parts.append(f"relaxed DDS {_names(relaxed)} tested exact")
    if ssp:
        parts.append(f"SSP {_names(ssp)} tested as BSP: staleness not covered")
    return "; ".join(parts)


def advice(entries: list[dict[str, Any]], app: str, objectives: Iterable[str]) -> str:
    """One line: what the verdict does not cover and how to check a property under the
    real relaxed/SSP execution (``replay chaos APP --check 'objective:NAME<=VALUE'``)."""
    relaxed = [e["name"] for e in entries if e["kind"] == "relaxed"]
    ssp = [e["name"] for e in entries if e["kind"] == "ssp"]
    ran = []
    if relaxed:
        ran.append(f"relaxed DDS {_names(relaxed)} exactly")
    if ssp:
        ran.append(f"SSP {_names(ssp)} as BSP")
    name = next(iter(objectives), "NAME")
    return (
        f"the dual test ran {' and '.join(ran)}, so it says nothing about the program as declared; "
        f"state a property and check it under the real execution: "
        f"replay chaos {app} --check 'objective:{name}<=VALUE'"
    )


def untested_of(detail: Any) -> list[dict[str, Any]]:
    """The ``not_tested`` entries of a stored verdict's detail (a dict a dual test wrote,
    or anything else: then none); entries without a kind and name are left out."""
    got = detail.get("not_tested") if isinstance(detail, dict) else None
    if not isinstance(got, list):
        return []
    return [e for e in got if isinstance(e, dict) and "kind" in e and "name" in e]


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)


__all__ = ["TESTED_AS", "UntestedWarning", "advice", "not_tested", "phrase", "untested_of"]
