"""Element ids, a fact of the trace format: which DDS element a lock id names.

The engine numbers element ``slot`` of the ``k``-th DDS a run created as
``k << SLOT_BITS | slot`` and names per-element locks by that id.  Every digest set of
an invocation lists the DDS alive then in creation order, so the longest one names
every DDS a lock can refer to.  The exporter and the browser both label locks this way
(``W[943]``); a test checks ``SLOT_BITS`` against the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._run import RunTrace

#: Bits of the slot in an element id.
SLOT_BITS = 40
_SLOT_MASK = (1 << SLOT_BITS) - 1


def element_name(element_id: int, names: Sequence[str]) -> str:
    """``W[943]`` for an element id, given the run's DDS names in creation order.

    The number in brackets is the slot: the index of a ``dvector``, the insertion
    position of a ``dmap`` key.  A DDS the names do not cover shows as ``#k[slot]``; a
    negative id (no element) as the bare number.
    """
    element_id = int(element_id)
    if element_id < 0:
        return str(element_id)
    k, slot = element_id >> SLOT_BITS, element_id & _SLOT_MASK
    return f"{names[k] if k < len(names) else f'#{k}'}[{slot}]"


def dds_names(run: RunTrace) -> list[str]:
    """The run's DDS names in creation order (empty when it recorded no digests)."""
    sets: dict[tuple[int, str, int], list[tuple[int, str]]] = {}
    for d in run.digests():
        sets.setdefault((d.node, d.op, d.invocation), []).append((d.seq, d.dds))
    best = max(sets.values(), key=len, default=[])
    return [name for _, name in sorted(best)]


__all__ = ["SLOT_BITS", "dds_names", "element_name"]
