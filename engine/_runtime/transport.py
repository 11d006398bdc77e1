"""Runtimes: an in-process cluster of P nodes, and one node per MPI rank.

The per-node logic of every operator is the same code for both; a runtime only
decides which nodes are local to this process and how values cross between nodes:

* ``run_on_nodes(fn)`` calls ``fn(node)`` for every local node (with every DDS bound to
  that node's replica) and returns the values of *all* nodes, in node order;
* ``exchange`` moves rows between nodes along routes both sides know in advance (the
  write-back of a round: ``engine._machines.routing``);
* ``gather_owned`` assembles a DDS from its owners' replicas.

MPI traffic uses a private ``Dup()`` of the communicator it is given.  Row blocks
travel with buffer methods (``Isend``/``Recv`` of raw bytes); only small control
objects and Python-object elements are pickled.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from .._data import digest as _digest
from .._errors import PeerRankFailed, peer_error
from .._machines.messages import MessageOrder

if TYPE_CHECKING:
    from .._data.dds import _DDS

#: The most nodes and threads per node a cluster takes: what a trace's run row can hold
#: (``tracer.RUN_LIMITS``, which the CLI checks too; the engine cannot import tracer).
#: An in-process cluster costs about 0.5 ms per node per loop invocation: 4,096 nodes
#: took 2 s for one tiny loop, and ``nodes=10**6`` ran for many minutes instead of
#: failing.
MAX_NODES = 4096
MAX_THREADS = 1024

#: MPI tag of routed row messages (numeric rows).  Every receive names its source, and
#: MPI keeps the messages of one (source, tag) in order, so a rank that is a round ahead
#: cannot be mistaken for this round's sender: its next message is taken a round later.
TAG_ROWS = 101
#: Object rows travel by pickle, received from a named source, so one tag serves.
TAG_OBJROWS = 102
#: The channel routed row messages are reported on (``Cluster.on_message``), with the
#: sender's exchange number: for the timeline and ``verify``, never to steer a replay
#: (their order is fixed by the routes).  Traces before routing have ``rows`` instead.
ROUTED = "routed"

#: One message of an exchange: (source node, destination node, [(dds, sorted slots)]).
Message = tuple[int, int, "list[tuple[_DDS, np.ndarray]]"]


def _owned_runs(dds: _DDS, nodes: int) -> list[tuple[int, int]] | None:
    """Each node's owned slots as a run ``(lo, hi)`` when they are contiguous runs that
    follow each other in node order from slot 0 to the end, else None."""
    known = dds._runs_from_layout(nodes)  # a dvector's bounds (51 -> 2 µs)
    if known is not None:
        return known
    runs, at = [], 0
    for node in range(nodes):
        own = dds.owned(node)
        if len(own) and (own[0] != at or own[-1] != at + len(own) - 1):
            return None
        if len(own) and not (np.diff(own) == 1).all():
            return None
        runs.append((at, at + len(own)))
        at += len(own)
    return runs if at == len(dds) else None


def _hash_rows(kind: str, head: bytes, parts: list[np.ndarray]) -> str:
    """The ``kind`` digest of ``head`` and the bytes of ``parts`` one after another."""
    if kind == _digest.CHUNKS:
        pieces, at = [], 0
        for part in parts:
            data = np.ascontiguousarray(part)
            pieces.append(_digest.piece(data, at))
            at += data.nbytes
        return _digest.combine(head, at, pieces)
    h = _digest.new(kind, head)
    for part in parts:
        h.update(np.ascontiguousarray(part).data)
    return _digest.text(kind, h)


def _numeric_nbytes(parts: list[tuple[_DDS, np.ndarray]]) -> int:
    """Payload bytes of a message's numeric rows."""
    return sum(d.row_nbytes() * len(s) for d, s in parts if d._numeric)


class Traffic:
    """Counters of what crossed between nodes: messages and bytes, sent and received.

    Always on (a few integer additions per message).  A message is one transfer from one
    node to another; its bytes are what travels on the wire, headers included (the
    in-process cluster counts what the MPI transport would send for the same message).
    Collectives of the driver (digests, ``reduce``, agreement) are not counted: these
    counters are about the rows an operator moves.
    """

    __slots__ = ("received_bytes", "received_messages", "sent_bytes", "sent_messages")

    def __init__(self) -> None:
        self.sent_messages = 0
        self.sent_bytes = 0
        self.received_messages = 0
        self.received_bytes = 0

    def sent(self, nbytes: int) -> None:
        """One message of ``nbytes`` left a node."""
        self.sent_messages += 1
        self.sent_bytes += nbytes

    def received(self, nbytes: int) -> None:
        """One message of ``nbytes`` reached a node."""
        self.received_messages += 1
        self.received_bytes += nbytes

    def snapshot(self) -> dict[str, int]:
        """The four counters as plain data."""
        return {k: getattr(self, k) for k in self.__slots__}


#: Header bytes of a write-back message: one int64, the sender's exchange number shifted
#: left by one, its low bit :data:`STOP_BIT`.  One word, not two: the flag costs no byte
#: on the wire, so traffic figures stay what they were before it travelled there.
ROWS_HEADER = 8
#: The header bit a sender sets when it has stopped following its plan (its own guard
#: violation, or one it heard of): the receiver stops running bodies too.
STOP_BIT = 1


class Cluster:
    """Interface shared by the runtimes."""

    size: int
    threads: int
    local_nodes: list[int]
    is_mpi: bool = False
    rank: int = 0

    def __init__(self, threads: int) -> None:
        if not 1 <= threads <= MAX_THREADS:
            raise ValueError(f"threads must be in [1, {MAX_THREADS}], got {threads}")
        self.threads = threads
        self._pools: dict[int, ThreadPoolExecutor] = {}
        self.bind: Callable[[int], None] = lambda node: None
        self.on_message: Callable[[int, str, int, int, int], None] | None = None
        #: the current invocation's message-order machine (set by the operator; free)
        self.messages = MessageOrder()
        #: what this process's nodes sent and received (see :class:`Traffic`)
        self.traffic = Traffic()
        #: collectives this process's exchanges made: one per attempt at an invocation
        #: (the outcome agreement of ``last``), none per round
        self.agreements = 0

    def pool(self, node: int) -> ThreadPoolExecutor:
        """The worker threads of ``node`` (created on first use)."""
        p = self._pools.get(node)
        if p is None:
            p = self._pools[node] = ThreadPoolExecutor(self.threads, f"node{node}")
        return p

    def close(self) -> None:
        for p in self._pools.values():
            p.shutdown(wait=True)
        self._pools.clear()

    def run_on_nodes(self, fn: Callable[[int], Any]) -> list[Any]:
        raise NotImplementedError

    def exchange(
        self,
        messages: list[Message],
        *,
        stopped: bool = False,
        last: bool = False,
        defer: list[int | None] | None = None,
    ) -> bool:
        """Deliver ``messages``: each local source sends its rows, each local destination
        takes them into its replica.  ``defer[k]``, when given and not None, is the round
        before which message ``k``'s destination must have its rows (:meth:`settle`):
        a transport may take them in as late as that.

        ``stopped``: the local nodes stopped following their plan (a guard violation,
        ``engine._asyncfor.guard``, here or heard of).  Returns whether they must run no
        more bodies: ``stopped``, or some node that sent one of them a message had
        stopped.  ``last`` marks an attempt's final exchange: then the answer is the
        whole cluster's, whether any node stopped anywhere (the attempt's outcome, which
        every node must agree on)."""
        raise NotImplementedError

    def settle(self, r: int) -> bool:
        """Before round ``r``: take in every deferred message due by then; returns whether
        one of them came from a node that had stopped following its plan."""
        return False

    def mark(self) -> tuple[Any, ...]:
        """The message counters, to :meth:`rewind` to when an attempt is undone."""
        return (self.messages.mark(),)

    def rewind(self, mark: tuple[Any, ...]) -> None:
        """Forget the messages of an undone attempt (their sequence numbers are reused)."""
        self.messages.rewind(mark[0])

    # ------------------------------------------------------------ time travel
    # A checkpoint stores each node's send counter so that a run restored from it numbers
    # the messages that follow as recorded.  Receives need no counter: each invocation's
    # schedule carries its own message log, matched from its first receive.
    def counters(self, node: int) -> dict[str, Any]:
        """``node``'s message counters as plain data (sends)."""
        return {"sent": self._sent(node)}

    def set_counters(self, node: int, counters: dict[str, Any]) -> None:
        """Set ``node``'s message counters to what :meth:`counters` returned."""
        self._set_sent(node, int(counters.get("sent", 0)))

    def _sent(self, node: int) -> int:
        return 0

    def _set_sent(self, node: int, n: int) -> None:
        pass

    def owned_digest(self, dds: _DDS, head: bytes, kind: str) -> str:
        """The ``kind`` digest (``engine._data.digest``) of ``head`` and then the owners'
        rows of the numeric ``dds`` in slot order: the bytes of :meth:`gather_owned`'s
        array, fed without making it when the owners hold contiguous runs of slots in
        node order (a ``dvector``)."""
        runs = _owned_runs(dds, self.size)
        if runs is None:
            return _hash_rows(kind, head, [self.gather_owned(dds)])
        return _hash_rows(
            kind,
            head,
            [dds.rows(node, slice(lo, hi)) for node, (lo, hi) in enumerate(runs)],  # type: ignore[arg-type]
        )

    def owned_digests(self, items: list[tuple[_DDS, bytes]], kind: str) -> list[str]:
        """:meth:`owned_digest` of each (numeric DDS, head), in order (collective)."""
        return [self.owned_digest(d, head, kind) for d, head in items]

    def gather_owned(self, dds: _DDS) -> np.ndarray:
        parts = self.run_on_nodes(lambda node: dds.rows(node, dds.owned(node)))
        owned = [dds.owned(p) for p in range(self.size)]
        n = len(dds)
        if dds._numeric:
            out = np.empty((n, *dds._shape), dtype=dds._dtype)
        else:
            out = np.empty(n, dtype=object)
        for slots, vals in zip(owned, parts, strict=True):
            if dds._numeric:
                out[slots] = vals
            else:
                for s, v in zip(slots.tolist(), vals, strict=True):
                    out[s] = v
        return out

    def barrier(self) -> None:
        pass

    def allgather(self, value: Any) -> list[Any]:
        """Values of one driver-level object from every process (SPMD)."""
        return [value]

    def alltoall(self, values: list[Any]) -> list[Any]:
        """``values[q]`` goes to process q; returns what each process sent this one."""
        return list(values[:1])


class InProcessCluster(Cluster):
    """All P nodes in this process; nodes run one after another, threads truly concurrent."""

    def __init__(self, nodes: int = 1, threads: int = 1) -> None:
        super().__init__(threads)
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be in [1, {MAX_NODES}], got {nodes}")
        self.size = nodes
        self.local_nodes = list(range(nodes))
        self._seqs: dict[int, int] = {}

    def run_on_nodes(self, fn: Callable[[int], Any]) -> list[Any]:
        out = []
        for node in self.local_nodes:
            self.bind(node)
            out.append(fn(node))
        self.bind(self.local_nodes[0])
        return out

    def mark(self) -> tuple[Any, ...]:
        return (*super().mark(), dict(self._seqs))

    def rewind(self, mark: tuple[Any, ...]) -> None:
        super().rewind(mark)
        self._seqs = dict(mark[1])

    def _sent(self, node: int) -> int:
        return self._seqs.get(node, 0)

    def _set_sent(self, node: int, n: int) -> None:
        self._seqs[node] = n

    def copy_rows(self, dds: _DDS, src: int, dst: int, slots: np.ndarray) -> None:
        """Copy rows ``slots`` of ``dds`` from ``src``'s replica into ``dst``'s."""
        if len(slots):
            dds.set_rows(dst, slots, dds.rows(src, slots))

    def exchange(
        self,
        messages: list[Message],
        *,
        stopped: bool = False,
        last: bool = False,
        defer: list[int | None] | None = None,
    ) -> bool:
        """Copy each message's rows from its source's replica into its destination's (a
        deferred one too: nobody touches its rows there before the round it is due).

        Every node is here, so ``stopped`` is already the whole cluster's answer (the
        loop gives up on the attempt after the exchange of the round in which any node
        stopped, as a cluster with a barrier per round would)."""
        for src, dst, parts in messages:
            for dds, slots in parts:
                self.copy_rows(dds, src, dst, slots)
            nbytes = _numeric_nbytes(parts)
            self.traffic.sent(ROWS_HEADER + nbytes)  # what MPI would send: header included
            self.traffic.received(ROWS_HEADER + nbytes)
            if self.on_message is not None:
                self.on_message(dst, ROUTED, src, self._seqs.get(src, 0), nbytes)
        for node in self.local_nodes:  # every node takes part in every exchange
            self._seqs[node] = self._seqs.get(node, 0) + 1
        return stopped


class MpiCluster(Cluster):
    """One node per MPI rank of ``comm`` (which is duplicated for private use)."""

    is_mpi = True

    def __init__(self, comm: Any, threads: int = 1) -> None:
        super().__init__(threads)
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = comm.Dup()
        self.size = self.comm.Get_size()
        self.rank = self.comm.Get_rank()
        self.local_nodes = [self.rank]
        self._seq_out = 0
        #: write-back sends not yet known complete, with the buffers they read from
        self._sending: list[tuple[Any, np.ndarray | None]] = []
        #: write-back receives this rank deferred to a later round (a counter)
        self.deferred = 0
        #: deferred write-back receives: (due round, source, exchange number, parts,
        #: buffer, request), in the order they were posted
        self._pending: list[
            tuple[int, int, int, list[tuple[_DDS, np.ndarray]], np.ndarray, Any]
        ] = []

    def close(self) -> None:
        super().close()
        try:
            self._finish_sends()
            self.comm.Free()
        except Exception:  # noqa: BLE001 - freeing at shutdown is best effort
            pass

    def run_on_nodes(self, fn: Callable[[int], Any]) -> list[Any]:
        """As in process: the lowest node whose ``fn`` raised raises it, on its rank; the
        others raise :class:`PeerRankFailed` (the ranks agree first, so the error does not
        depend on which rank failed first)."""
        self.bind(self.rank)
        failed: Exception | None = None
        try:
            value = fn(self.rank)
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the ranks agree
            failed, value = exc, None
        bad = None if failed is None else peer_error(failed)
        got = self.comm.allgather((bad, value))
        first = next((r for r, (b, _) in enumerate(got) if b is not None), None)
        if first is None:
            return [v for _, v in got]
        if first == self.rank and failed is not None:
            raise failed
        raise PeerRankFailed(first, got[first][0])

    def allgather(self, value: Any) -> list[Any]:
        return self.comm.allgather(value)

    def alltoall(self, values: list[Any]) -> list[Any]:
        """``values[q]`` goes to rank q; returns what each rank sent this one."""
        return self.comm.alltoall(values)

    def owned_digests(self, items: list[tuple[_DDS, bytes]], kind: str) -> list[str]:
        """As in process.  With xxh3-chunks, each rank hashes the whole chunks inside the
        rows it owns of every DDS whose owners hold runs (``_owned_runs``) and the ranks
        swap only those digests and the bytes of the chunks that straddle two ranks' rows,
        in one ``allgather``; every rank then combines them.  Other DDS (and every DDS
        with the older hashes) go to rank 0 as raw rows in one ``Gatherv`` and their
        digests come back in one ``bcast``."""
        if not items:
            return []
        runs = [_owned_runs(d, self.size) for d, _ in items]
        out: list[str | None] = [None] * len(items)
        if kind == _digest.CHUNKS:
            local = [k for k, r in enumerate(runs) if r is not None]
            mine = []
            for k in local:
                d = items[k][0]
                lo, hi = runs[k][self.rank]  # type: ignore[index]
                rows = np.ascontiguousarray(d.rows(self.rank, slice(lo, hi)))  # type: ignore[arg-type]
                mine.append(_digest.piece(rows, lo * d.row_nbytes()))
            if local:
                every = self.comm.allgather(mine)
                for j, k in enumerate(local):
                    d, head = items[k]
                    pieces = [got[j] for got in every]
                    out[k] = _digest.combine(head, len(d) * d.row_nbytes(), pieces)
        rest = [k for k in range(len(items)) if out[k] is None]
        if rest:
            texts = self._digests_at_root([items[k] for k in rest], [runs[k] for k in rest], kind)
            for k, text in zip(rest, texts, strict=True):
                out[k] = text
        return [str(t) for t in out]

    def _digests_at_root(
        self,
        items: list[tuple[_DDS, bytes]],
        runs: list[list[tuple[int, int]] | None],
        kind: str,
    ) -> list[str]:
        """Every rank sends rank 0 the owned rows of every DDS as raw bytes in one
        ``Gatherv`` (a rank's DDS one after another); rank 0 hashes them and sends back
        the digests in one ``bcast``."""
        MPI, comm, size = self._MPI, self.comm, self.size
        # counts[k][p]: bytes of DDS k that rank p owns
        counts = []
        for (d, _), r in zip(items, runs, strict=True):
            n_rows = (
                [hi - lo for lo, hi in r]
                if r is not None
                else [len(d.owned(p)) for p in range(size)]
            )
            counts.append(np.array(n_rows, dtype=np.int64) * d.row_nbytes())
        mine = []
        for (d, _), r in zip(items, runs, strict=True):
            own: Any = d.owned(self.rank) if r is None else slice(*r[self.rank])
            mine.append(np.ascontiguousarray(d.rows(self.rank, own)).view(np.uint8).ravel())
        send = mine[0] if len(mine) == 1 else np.concatenate(mine)
        if self.rank != 0:
            comm.Gatherv([send, MPI.BYTE], None, root=0)
            return [str(t) for t in comm.bcast(None, root=0)]
        per_rank = np.sum(counts, axis=0)
        displs = np.concatenate([[0], np.cumsum(per_rank)[:-1]])
        got = np.empty(int(per_rank.sum()), dtype=np.uint8)
        comm.Gatherv([send, MPI.BYTE], [got, (per_rank, displs), MPI.BYTE], root=0)
        texts = []
        for k, ((d, head), r) in enumerate(zip(items, runs, strict=True)):
            # rank p's bytes of DDS k follow its bytes of the DDS before k
            starts = displs + (np.sum(counts[:k], axis=0) if k else 0)
            parts = [got[int(a) : int(a) + int(n)] for a, n in zip(starts, counts[k], strict=True)]
            if r is not None:  # the owners' runs, in node order, are the slot order
                texts.append(_hash_rows(kind, head, parts))
            else:
                order = np.concatenate([d.owned(p) for p in range(size)])
                flat = np.concatenate(parts) if parts else got[:0]
                rows = flat.view(d._dtype).reshape(len(order), *(d._shape or ()))
                whole = np.empty_like(rows)
                whole[order] = rows
                texts.append(_hash_rows(kind, head, [whole]))
        return [str(t) for t in comm.bcast(texts, root=0)]

    def owned_digest(self, dds: _DDS, head: bytes, kind: str) -> str:
        return self.owned_digests([(dds, head)], kind)[0]

    def barrier(self) -> None:
        self.comm.Barrier()

    def mark(self) -> tuple[Any, ...]:
        return (*super().mark(), self._seq_out)

    def rewind(self, mark: tuple[Any, ...]) -> None:
        super().rewind(mark)
        self._seq_out = mark[1]

    def _sent(self, node: int) -> int:
        return self._seq_out

    def _set_sent(self, node: int, n: int) -> None:
        self._seq_out = n

    def exchange(
        self,
        messages: list[Message],
        *,
        stopped: bool = False,
        last: bool = False,
        defer: list[int | None] | None = None,
    ) -> bool:
        """Send this rank's messages, receive the ones addressed to it (each from its named
        source, with the size the routes give); no collective except at ``last``.

        A message ``defer`` gives a round for is not waited for here: its receive is
        posted now (so that MPI matches it before any later message of the same source)
        and completed by :meth:`settle` just before that round, the first in which this
        rank touches its rows; until then the guard marks them (``mark_pending``).  A
        rank then waits for a sender only where it needs the rows, not in the round after
        they were sent (a token plan's hand-offs: ``Plan.first_use_imbalance``).

        A ring, not a barrier per round: a rank waits only for the ranks that send it
        rows, so it may run rounds ahead of a rank it hears nothing from.  What keeps an
        attempt deterministic when a node leaves its plan:

        * the stop travels in the header (:data:`STOP_BIT`), from the round it happened
          on, along the routes; a receiver of a flagged message runs no more bodies.  So
          whether a node runs round ``r`` depends only on the routes and on which nodes
          stopped in which round, never on timing, and every body that runs sees the
          state a valid run of the plan's first rounds gives (rows that depend on a
          stopped node's work reach a node only flagged);
        * a stopped rank keeps taking part in every exchange of the attempt (the loop
          calls this for every round and the final exchange; it sends every message the
          routes give it, flagged, and receives its own), so nobody waits forever;
        * the outcome is agreed once, at ``last``: one ``Allreduce`` of the flag (a
          stopped rank's flag must reach ranks it sends nothing to); the caller then
          undoes the attempt on every rank and reports the violation with the smallest
          (round, node) (``engine._asyncfor.loop``).

        Sends are not waited for before ``last`` (their buffers are kept until then):
        only a receive makes a rank wait.  Each message starts with the sender's exchange
        number, checked on arrival: the ranks call ``exchange`` in the same sequence, and
        MPI keeps one (source, tag)'s messages in order, so a different number is a bug."""
        MPI = self._MPI
        comm, me = self.comm, self.rank
        seq = self._seq_out
        self._seq_out += 1
        head = np.array([seq << 1 | (STOP_BIT if stopped else 0)], dtype=np.int64).view(np.uint8)
        for src, dst, parts in messages:
            if src != me:
                continue
            msg = np.concatenate([head, self._pack(parts)])
            self._sending.append((comm.Isend([msg, MPI.BYTE], dst, TAG_ROWS), msg))
            objs = [dds.rows(me, s) for dds, s in parts if not dds._numeric]
            if objs:
                self._sending.append((comm.isend(objs, dst, TAG_OBJROWS), None))
            self.traffic.sent(len(msg))
        heard = self.settle(None) if last else False  # older rows first, then the final
        for k, (src, dst, parts) in enumerate(messages):
            if dst != me:
                continue
            buf = np.empty(len(head) + _numeric_nbytes(parts), dtype=np.uint8)
            due = None if defer is None or last else defer[k]
            if due is not None:
                req = comm.Irecv([buf, MPI.BYTE], src, TAG_ROWS)
                self._pending.append((due, src, seq, parts, buf, req))
                self.deferred += 1
                self.traffic.received(len(buf))
                if self.on_message is not None:  # logged in exchange order, as before
                    self.on_message(me, ROUTED, src, seq, len(buf) - len(head))
                continue
            comm.Recv([buf, MPI.BYTE], src, TAG_ROWS)
            self.traffic.received(len(buf))
            heard |= self._take(src, seq, parts, buf)
            if self.on_message is not None:
                self.on_message(me, ROUTED, src, seq, len(buf) - len(head))
            if any(not d._numeric for d, _ in parts):
                it = iter(comm.recv(source=src, tag=TAG_OBJROWS))
                for dds, slots in parts:
                    if not dds._numeric:
                        dds.set_rows(me, slots, next(it))
        halted = stopped or heard
        if not last:
            if self._sending and MPI.Request.Testall([r for r, _ in self._sending]):
                self._sending.clear()
            return halted
        # the buffer form: it releases the GIL while it waits (the pickle form holds it, and
        # a thread of this process may still have to hand a send to MPI)
        flag = np.array([int(halted)], dtype=np.int64)
        anyone = np.zeros(1, dtype=np.int64)
        comm.Allreduce([flag, MPI.INT64_T], [anyone, MPI.INT64_T], op=MPI.MAX)
        self.agreements += 1
        self._finish_sends()
        return bool(anyone[0])

    def settle(self, r: int | None) -> bool:
        """Complete, in the order they were posted, the deferred receives due before
        round ``r`` (None: all of them), and take their rows in."""
        if not self._pending:
            return False
        heard = False
        keep = []
        for entry in self._pending:
            due, src, seq, parts, buf, req = entry
            if r is not None and due > r:
                keep.append(entry)
                continue
            req.Wait()
            heard |= self._take(src, seq, parts, buf)
        self._pending = keep
        return heard

    def _take(
        self, src: int, seq: int, parts: list[tuple[_DDS, np.ndarray]], buf: np.ndarray
    ) -> bool:
        """Check a received write-back's header and put its rows in; returns its stop flag."""
        word = int(buf[:ROWS_HEADER].view(np.int64)[0])
        got = word >> 1
        if got != seq:
            raise RuntimeError(
                f"write-back out of step: rank {src} sent the rows of exchange {got} "
                f"while rank {self.rank} was in exchange {seq}"
            )
        self._unpack(parts, buf[ROWS_HEADER:])
        return bool(word & STOP_BIT)

    def _finish_sends(self) -> None:
        """Wait for every send still in flight, then drop its buffer."""
        if self._sending:
            self._MPI.Request.Waitall([r for r, _ in self._sending])
            self._sending.clear()

    # ------------------------------------------------------------ sync_for transport
    # Nonblocking buffer methods on raw uint8 blocks (sync_for deltas and updates):
    # the hot path never pickles.  Callers keep every buffer alive until its request
    # has completed.
    def isend_bytes(self, buf: np.ndarray, dest: int, tag: int) -> Any:
        """Start sending the uint8 block ``buf`` to ``dest``; returns the request."""
        return self.comm.Isend([buf, self._MPI.BYTE], dest, tag)

    def irecv_bytes(self, buf: np.ndarray, source: int, tag: int) -> Any:
        """Post a receive of exactly ``len(buf)`` bytes from ``source`` into ``buf``."""
        return self.comm.Irecv([buf, self._MPI.BYTE], source, tag)

    def null_request(self) -> Any:
        """A request that is already complete (a placeholder in request lists)."""
        return self._MPI.REQUEST_NULL

    def test_some(self, requests: list[Any]) -> list[int] | None:
        """Indices of ``requests`` that completed, without blocking (entries become null);
        None when every entry already was null."""
        done = self._MPI.Request.Testsome(requests)
        return None if done is None else list(done)

    def wait_all(self, requests: list[Any]) -> None:
        """Block until every request in ``requests`` has completed."""
        self._MPI.Request.Waitall(requests)

    def _pack(self, parts: list[tuple[_DDS, np.ndarray]]) -> np.ndarray:
        blocks = [
            np.ascontiguousarray(dds.rows(self.rank, slots)).view(np.uint8).ravel()
            for dds, slots in parts
            if dds._numeric and len(slots)
        ]
        return np.concatenate(blocks) if blocks else np.empty(0, dtype=np.uint8)

    def _unpack(self, parts: list[tuple[_DDS, np.ndarray]], data: np.ndarray) -> None:
        off = 0
        for dds, slots in parts:
            if not dds._numeric or not len(slots):
                continue
            nb = dds.row_nbytes() * len(slots)
            block = data[off : off + nb].view(dds._dtype).reshape((len(slots), *dds._shape))
            dds.set_rows(self.rank, slots, block)
            off += nb
        if off != len(data):
            raise RuntimeError(f"write-back size mismatch: expected {off} bytes, got {len(data)}")


def under_mpi_launcher() -> bool:
    """True when this process was started by an MPI launcher (mpiexec/mpirun/srun)."""
    keys = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
    return any(k in os.environ for k in keys)


__all__ = [
    "Cluster",
    "InProcessCluster",
    "Message",
    "MpiCluster",
    "Traffic",
    "under_mpi_launcher",
]
