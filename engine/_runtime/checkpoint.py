"""Checkpoints at operator ends, fast-forward to one, and served collective values.

Why it is built this way (issue 16, time travel): the driver's own Python state
(``g *= 0.9``) is never saved, so a run restored from a checkpoint re-runs the driver
from the start.  Loop invocations up to the checkpoint are skipped, every value the
driver got from a collective operator (``reduce``, ``gather``) is served from the trace
instead of computed on stale DDS, and at the checkpoint the DDS some loop body wrote
are put back.  DDS no body writes (the loaded ratings) are re-created by the driver.

Only the DDS written by a loop body are stored (relaxed DDS always: reconnaissance does
not see their writes, and LDA's replayed from checkpoints without them diverged at once),
and each node stores only the rows it owns (no node gathers the model).  Numeric rows
are arrays; object rows only if they are plain data (numbers, strings, tuples and lists
of them), otherwise that DDS is left out with one line saying why.

The policy (``Recorder.checkpoint_every``): 0 never; N after loop invocations 0, N,
2N, ...; None (the default of a traced run) after invocation 0, and from then on every
k-th, where k = ceil(cost of the last checkpoint / (BUDGET / 2 x the time of the
invocation it followed)), agreed by every rank (the largest k) and measured again at
each checkpoint, so that checkpoints cost at most ``BUDGET`` of the run time with a
factor of two to spare for noise in the measurement.  The automatic policy also holds
checkpoints to ``BYTES_PER_BODY`` of store per loop body run (beyond ``FREE_BYTES`` per
checkpoint): a checkpoint is O(model) and an epoch of SGDMF at rank 32 runs only a few
bodies per model row, so one checkpoint per epoch was 10 of the 16 bytes per body a
P = 64 synthetic trace grew by (docs/scale.md, 2026-12-06).  Fewer checkpoints cost
only time: ``--from`` and ``resume`` start at the nearest earlier one (invocation 0 at
worst) and replay forward to the same bits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import SessionError, StaleDriverReadError
from .session import Session, current, driver_only

if TYPE_CHECKING:
    from .._data import dds as _dds

#: Share of the run time the automatic policy lets checkpoints take.  Small, because a
#: traced run's whole recording overhead is held to 5% (benchmarks/kernels.py) and the
#: commits need most of that; what it costs is how far ``--from`` may start before the
#: invocation asked for (a fast loop gets a checkpoint every few invocations).
BUDGET = 0.03
#: Checkpoint bytes the automatic policy allows per loop body run since the last one: the
#: trace's whole budget is 1 byte per body (DESIGN.md, section 9), and a checkpoint of
#: the synthetic SGDMF model (205 kB) would otherwise cost 10 per body every epoch.
BYTES_PER_BODY = 0.25
#: Bytes of a checkpoint that the byte budget ignores: a small model is checkpointed as
#: often as the time budget allows.
FREE_BYTES = 4096
#: Element dtypes a checkpoint stores as arrays (the trace codec holds them losslessly).
ARRAY_KINDS = "fiub"


@dataclass(frozen=True, slots=True)
class Rows:
    """One node's owned rows of one DDS: ``values`` is an array (numeric DDS) or a list."""

    dds: str
    kind: str  # "array" or "plain"
    slots: np.ndarray
    values: Any
    shape: tuple[int, ...]
    dtype: str
    length: int  # elements of the whole DDS


def plain_reason(value: Any, depth: int = 0) -> str | None:
    """None if ``value`` is plain data (None, bool, int, float, str, tuples and lists of
    them); otherwise why not."""
    if depth > 32:
        return "it nests deeper than 32 levels"
    if value is None or isinstance(value, (bool, int, float, str)):
        return None
    if isinstance(value, (tuple, list)):
        for v in value:
            why = plain_reason(v, depth + 1)
            if why is not None:
                return why
        return None
    return f"it holds a {type(value).__qualname__} object, not plain data"


# ------------------------------------------------------------------ recording
def end_invocation(
    sess: Session,
    op: str,
    invocation: int,
    written: list[_dds._DDS],
    seconds: float,
    bodies: int | None = None,
) -> None:
    """At the end of a loop invocation: note what its bodies wrote and take a checkpoint
    if the policy says so (every rank decides alike).  ``bodies``: the loop bodies the
    invocation ran (None: no byte budget)."""
    for d in written:
        sess.body_written.setdefault(d.name, d)
    step = sess.steps
    sess.steps += 1
    every = sess.recorder.checkpoint_every
    if every == 0:
        return
    st = sess.checkpoint_state
    if every is None:
        k = int(st.get("k", 1))
        due = step == 0 or step - int(st.get("last", 0)) >= k
    else:
        due = step % int(every) == 0
    if not due:
        return
    sess.announce(f"checkpoint after {op}#{invocation}")
    t0 = time.perf_counter()
    nbytes = _write(sess, op, invocation, step)
    cost = time.perf_counter() - t0
    st["last"] = step
    if every is None:  # aim at half the budget: one noisy measurement keeps it under
        mine = math.ceil(cost / max(BUDGET / 2 * seconds, 1e-9))
        got = sess.cluster.allgather((mine, nbytes))
        k = max(1, *(int(x) for x, _ in got))
        over = sum(int(b) for _, b in got) - FREE_BYTES
        if bodies is not None and over > 0:
            k = max(k, math.ceil(over / (BYTES_PER_BODY * max(int(bodies), 1))))
        st["k"] = k


def _write(sess: Session, op: str, invocation: int, step: int) -> int:
    """Hand every local node's checkpoint to the recorder; the bytes it stored."""
    refused: list[tuple[str, str]] = []
    per_node: dict[int, list[Rows]] = {n: [] for n in sess.cluster.local_nodes}
    for name, d in sess.body_written.items():
        numeric = d.shape is not None
        if numeric and np.dtype(d._dtype).kind not in ARRAY_KINDS:
            refused.append((name, f"its elements are {d._dtype}, not integers or floats"))
            continue
        blocks = []
        why = None
        for node in sess.cluster.local_nodes:
            slots = np.asarray(d.owned(node), dtype=np.int64)
            vals = d.rows(node, slots)
            if not numeric:
                vals = list(vals)
                why = plain_reason(vals)
                if why is not None:
                    break
            blocks.append(
                Rows(
                    name,
                    "array" if numeric else "plain",
                    slots,
                    np.ascontiguousarray(vals) if numeric else vals,
                    tuple(d.shape or ()),
                    np.dtype(d._dtype).str if numeric else "object",
                    len(d),
                )
            )
        if why is not None:
            refused.append((name, why))
            continue
        for node, rows in zip(sess.cluster.local_nodes, blocks, strict=True):
            per_node[node].append(rows)
    said = sess.checkpoint_state.setdefault("said", set())
    for name, why in refused:
        if name not in said and sess.cluster.rank == 0:
            said.add(name)
            sess.warn(f"note: DDS {name!r} is not checkpointed: {why}")
    nbytes = 0
    for node, blocks in per_node.items():
        nbytes += int(
            sess.recorder.checkpoint(
                op, invocation, node, step, blocks, sess.cluster.counters(node), refused
            )
            or 0
        )
    return nbytes


def collective(sess: Session, kind: str, compute: Callable[[], Any]) -> Any:
    """The value of the driver's next collective call: served from the trace while the
    run fast-forwards to a checkpoint, otherwise computed (and recorded)."""
    what = f"ap.{kind}" if kind != "gather" else "gather()"
    driver_only(what)
    k = sess.collectives
    sess.collectives += 1
    sess.agree(f"{what} (collective call {k})")
    if sess.fast_forward is not None:
        return sess.hooks.served_value(k, kind)
    value = compute()
    if sess.cluster.rank == 0:
        sess.recorder.collective_value(k, kind, value)
    return value


# ------------------------------------------------------------------ fast-forward
#: Set while a run fast-forwards past a skipped loop invocation: every driver read of a
#: DDS element calls it with the DDS (``engine._data.dds``).  A DDS the checkpoint holds
#: was written by the skipped bodies, so its value there is stale until the checkpoint is
#: restored: the read is refused (:class:`StaleDriverReadError`), never served wrong.
STALE: Callable[[Any], None] | None = None


def _stale_guard(names: frozenset[str], target: tuple[str, int]) -> Callable[[Any], None]:
    def check(d: Any) -> None:
        if d.name in names:
            raise StaleDriverReadError(
                f"the driver reads an element of DDS {d.name!r} directly before "
                f"{target[0]}#{target[1]}, while the run fast-forwards to that checkpoint: "
                "the loop bodies that wrote it were skipped, so the value would not be the "
                "recorded run's; compute it with ap.reduce or X.gather() (served from the "
                "trace), or replay from the start"
            )

    return check


def end_fast_forward() -> None:
    """Drop the stale-read guard (the checkpoint is restored, or the run ended)."""
    global STALE
    STALE = None


def skip_invocation(sess: Session, op: str, invocation: int) -> bool:
    """True when this loop invocation is skipped (the run fast-forwards to a checkpoint);
    at the checkpoint's own invocation the DDS are restored from it."""
    global STALE
    target = sess.fast_forward
    if target is None:
        return False
    sess.steps += 1
    sess.hooks.skipped(op, invocation)
    cp = sess.checkpoint_state.get("fast_forward_to")
    if cp is None:  # the first skipped invocation: driver reads of its DDS turn stale
        cp = sess.checkpoint_state["fast_forward_to"] = sess.hooks.restore(*target)
        STALE = _stale_guard(frozenset(cp.rows), (str(target[0]), int(target[1])))
        sess.on_end.append(end_fast_forward)
    if (op, invocation) == tuple(target):
        sess.fast_forward = None  # from here on collective values are computed
        end_fast_forward()
        restore(sess, cp)
        if sess.recorder.checkpoint_every != 0:
            # a recorded run that starts here (``replay resume``) holds the checkpoint it
            # started from: it can itself be replayed, and resumed, from that point on
            step = sess.steps - 1
            _write(sess, op, invocation, step)
            sess.checkpoint_state["last"] = step
    return True


def restore(sess: Session, cp: Any) -> None:
    """Put a checkpoint's rows into every local replica and set the message counters."""
    by_name = {d.name: d for d in sess.dds}
    restored = []
    for name, (slots, values) in cp.rows.items():
        d = by_name.get(name)
        if d is None:
            raise SessionError(
                f"the checkpoint holds DDS {name!r}, which this run has not created by then "
                "(the program changed?)"
            )
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) and int(slots.max()) >= len(d):
            raise SessionError(
                f"the checkpoint holds row {int(slots.max())} of DDS {name!r}, which has "
                f"{len(d)} element(s) in this run (the program or its data changed?)"
            )
        for node in sess.cluster.local_nodes:  # a sharded node keeps the rows it holds
            d.set_rows(node, slots, values, held_only=True)
        if d._dirty is not None and d._holder is not None:  # these rows are whole again
            keep = ~np.isin(d._dirty, slots)
            d._dirty, d._holder = (d._dirty[keep], d._holder[keep]) if keep.any() else (None, None)
        sess.body_written.setdefault(name, d)
        restored.append(d)
    for node in sess.cluster.local_nodes:
        c = cp.counters.get(node)
        if c is not None:
            sess.cluster.set_counters(node, c)
    if restored:  # a damaged checkpoint is named here, not by a later digest
        digests = sess.digests_of(restored)
        names = [d.name for d in restored]
        sess.hooks.check_restored(cp.op, cp.invocation, list(zip(names, digests, strict=True)))


# ------------------------------------------------------------------ inspection
def find_dds(name: str) -> Any:
    """The current run's DDS named ``name``, or None (history and watch find theirs)."""
    for d in current().dds:
        if d.name == name:
            return d
    return None


def dds_contents(d: Any) -> Any:
    """Every element of ``d`` from its owners, without counting as a collective call
    of the driver (so inspecting a replay does not shift the served values)."""
    return d._sess.cluster.gather_owned(d)


def local_owned_rows(d: Any) -> list[tuple[np.ndarray, Any]]:
    """``(slots, values)`` of the rows each node hosted by this process owns (every node
    in an in-process cluster, this rank's under MPI); no collective call, so a rank can
    read them while the others have stopped."""
    return [(d.owned(node), d.rows(node, d.owned(node))) for node in d._sess.cluster.local_nodes]


__all__ = [
    "dds_contents",
    "local_owned_rows",
    "find_dds",
    "BUDGET",
    "Rows",
    "collective",
    "end_invocation",
    "plain_reason",
    "skip_invocation",
]
