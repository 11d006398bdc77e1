"""What crosses between the ``replay`` process and the ranks of its MPI job.

The ranks may run on other hosts than the ``replay`` process, and rank 0 on another
host than the others: no file the parent writes is visible to a rank, and no file a
rank writes is visible to the parent.  Two channels reach every rank on any cluster,
because mpiexec itself carries them:

* parent → ranks: mpiexec's stdin, which hydra forwards to rank 0 only.  The job spec
  goes there as one header line ``replay-spec <length> <blake2b>`` and the JSON bytes;
  rank 0 checks them and broadcasts the spec.  Hydra's proxy gives up ("process reading
  stdin too slowly") when rank 0's stdin pipe is full, and stdin that reaches mpiexec
  before rank 0 runs may be lost, so the bytes go in pieces of :data:`SPEC_PIECE`
  bytes, piece K once rank 0 has said it is ready for it with a line ``@replay-ack K``
  on its stdout (K = 0: rank 0 runs and reads).  The pipe then stays open for as long as
  the parent waits for the job: its end (EOF) tells rank 0 that the parent is gone,
  wherever the two run (``_worker``).
* ranks → parent: mpiexec's forwarded stdout.  A report (rank 0's result, a rank's
  error or divergence) is cut into *frames*, one line each::

      @replay-frame 1 RANK KIND MESSAGE PIECE COUNT LENGTH BLAKE2B DATA

  DATA is the base64 of at most :data:`PIECE_BYTES` bytes of the report's JSON.
  mpiexec interleaves the ranks' output at whatever boundaries it read it, so a line
  of one rank may be cut by another's: each frame is written with one ``write`` of
  less than ``PIPE_BUF`` bytes (which a pipe never splits), and the parent still
  checks the length and the digest of every frame and refuses a report whose frames
  do not all arrive intact (:class:`FrameError`), rather than trust it.

Everything here is pure (bytes and strings in, values out) but :func:`emit`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from ._errors import LaunchError

#: The first word of a frame line.
FRAME_MARK = "@replay-frame"
#: The first word of the spec header on rank 0's stdin.
SPEC_MARK = b"replay-spec"
#: The first word of rank 0's acknowledgement of a piece of the spec.
ACK_MARK = "@replay-ack"
#: Spec bytes the parent sends before it waits for rank 0 to acknowledge them: well
#: under the 64 KiB a pipe holds, so that hydra's proxy never finds rank 0's stdin full.
SPEC_PIECE = 16384
#: Version of both formats: a rank from another installation is refused, not misread.
VERSION = 1
#: Report bytes per frame: its base64 (4/3 of it) and the header stay under PIPE_BUF
#: (4096 on Linux), so a frame is one atomic write that no other rank's output can cut.
PIECE_BYTES = 2400


class FrameError(LaunchError):
    """A report of the job reached the parent mangled or incomplete."""


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


# ====================================================================== parent → rank 0
def spec_pieces(spec: dict[str, Any]) -> list[bytes]:
    """What the parent writes to mpiexec's stdin: the header line, then the spec's JSON in
    pieces; piece K only once rank 0 is ready for it (:func:`read_spec`)."""
    data = json.dumps(spec).encode()
    header = b"%s %d %d %s\n" % (SPEC_MARK, VERSION, len(data), _digest(data).encode())
    return [header] + [data[k : k + SPEC_PIECE] for k in range(0, len(data), SPEC_PIECE)]


def ack_line(k: int) -> str:
    """Rank 0's line saying it is ready for piece ``k`` of the spec (0: the header)."""
    return f"{ACK_MARK} {k}"


def parse_ack(line: str) -> int | None:
    """The piece a line of mpiexec's stdout asks for (None: not such a line)."""
    if not line.startswith(ACK_MARK + " "):
        return None
    text = line[len(ACK_MARK) + 1 :].strip()
    return int(text) if text.isdigit() else None


def read_spec(stream: IO[bytes], ack: Callable[[int], None] = lambda k: None) -> dict[str, Any]:
    """Read and check the spec :func:`spec_pieces` sent (rank 0, from its stdin), asking
    for each piece K with ``ack(K)`` once ready for it."""
    ack(0)
    header = stream.readline(200)
    ack(1)
    parts = header.split()
    if len(parts) != 4 or parts[0] != SPEC_MARK or parts[1] != str(VERSION).encode():
        raise FrameError(
            f"rank 0 did not receive a job spec on its stdin (got {header[:60]!r}); "
            "start jobs with 'replay', which sends it, or check that mpiexec forwards stdin"
        )
    size, want = int(parts[2]), parts[3].decode()
    chunks, got = [], 0
    while got < size:
        chunk = stream.read(min(SPEC_PIECE, size - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
        ack(len(chunks) + 1)
    data = b"".join(chunks)
    if len(data) != size or _digest(data) != want:
        raise FrameError(
            f"the job spec reached rank 0 damaged ({len(data)} of {size} bytes, digest "
            f"{_digest(data)} instead of {want}); run the command again"
        )
    spec: dict[str, Any] = json.loads(data)
    return spec


# ====================================================================== ranks → parent
def frames(rank: int, kind: str, report: dict[str, Any]) -> list[str]:
    """The frame lines (without newlines) that carry ``report`` of ``kind`` from ``rank``."""
    data = json.dumps(report).encode()
    message = secrets.token_hex(4)
    pieces = [data[k : k + PIECE_BYTES] for k in range(0, len(data), PIECE_BYTES)] or [b""]
    return [
        f"{FRAME_MARK} {VERSION} {rank} {kind} {message} {i} {len(pieces)} {len(p)} "
        f"{_digest(p)} {base64.b64encode(p).decode()}"
        for i, p in enumerate(pieces)
    ]


def emit(rank: int, kind: str, report: dict[str, Any]) -> None:
    """Write ``report`` to stdout as frames, each with one ``write`` (see module doc)."""
    sys.stdout.flush()  # what the rank printed before stays before the report
    for line in frames(rank, kind, report):
        write_line(line)


def write_line(line: str) -> None:
    """Write one line to stdout with one ``write`` (a pipe keeps it whole)."""
    data = (line + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


@dataclass(frozen=True, slots=True)
class Report:
    """One report a rank sent, reassembled and checked."""

    rank: int
    kind: str
    data: dict[str, Any]


@dataclass
class FrameReader:
    """Collects the frames among the lines of mpiexec's stdout (the parent's side).

    :meth:`feed` takes each line: a frame is kept (False: not a frame, the caller shows
    it).  A damaged frame is remembered, never trusted; :meth:`reports` then raises it.
    """

    _pieces: dict[tuple[int, str, str], dict[int, bytes]] = field(default_factory=dict)
    _counts: dict[tuple[int, str, str], int] = field(default_factory=dict)
    _done: list[Report] = field(default_factory=list)
    damage: str | None = None

    def feed(self, line: str) -> bool:
        """Take one line of mpiexec's stdout; True if it was (part of) a frame."""
        at = line.find(FRAME_MARK)
        if at < 0:
            return False
        if at > 0:
            self._damaged(f"a frame started inside another line ({line[:at][-40:]!r} before it)")
            return True
        parts = line.split(" ")
        try:
            _, version, rank_s, kind, message, i_s, n_s, len_s, digest, text = parts
            rank, i, n, size = int(rank_s), int(i_s), int(n_s), int(len_s)
            if version != str(VERSION):
                raise ValueError(f"version {version}")
            data = base64.b64decode(text, validate=True)
        except ValueError as exc:
            self._damaged(f"a frame line that does not parse ({exc}): {line[:80]!r}")
            return True
        if len(data) != size or _digest(data) != digest or not 0 <= i < n:
            self._damaged(
                f"a frame of rank {rank} whose length or digest does not match its data "
                f"({len(data)} bytes, {size} announced)"
            )
            return True
        key = (rank, kind, message)
        if self._counts.setdefault(key, n) != n:
            self._damaged(f"frames of one report of rank {rank} disagree on their count")
            return True
        got = self._pieces.setdefault(key, {})
        got[i] = data
        if len(got) == n:
            del self._pieces[key], self._counts[key]
            try:
                report = json.loads(b"".join(got[k] for k in range(n)))
            except ValueError as exc:
                self._damaged(f"rank {rank}'s {kind} report is not JSON ({exc})")
                return True
            self._done.append(Report(rank, kind, report))
        return True

    def _damaged(self, what: str) -> None:
        if self.damage is None:
            self.damage = what

    def reports(self) -> list[Report]:
        """Every complete report, by rank; :class:`FrameError` if any frame was damaged."""
        if self.damage is not None:
            raise FrameError(
                f"a report of the MPI job reached this process mangled: {self.damage}; "
                "its outcome is unknown, run the command again"
            )
        return sorted(self._done, key=lambda r: r.rank)

    def arrived(self) -> list[Report]:
        """Every complete report in the order it arrived (even if a frame was damaged)."""
        return list(self._done)

    def hellos(self) -> list[dict[str, Any]]:
        """The hello reports that arrived whole (even if another frame was damaged)."""
        return [r.data for r in self._done if r.kind == "hello"]

    def incomplete(self) -> FrameError | None:
        """The error to raise for a report still missing frames (once the job ended)."""
        if not self._pieces:
            return None
        (rank, kind, message), got = next(iter(self._pieces.items()))
        n = self._counts[(rank, kind, message)]
        return FrameError(
            f"rank {rank}'s {kind} report reached this process incomplete ({len(got)} of "
            f"{n} frames: the rank was killed while it sent it, or mpiexec lost output); "
            "its outcome is unknown, run the command again"
        )


__all__ = [
    "FRAME_MARK",
    "FrameError",
    "FrameReader",
    "Report",
    "emit",
    "ack_line",
    "frames",
    "parse_ack",
    "read_spec",
    "spec_pieces",
    "write_line",
]
