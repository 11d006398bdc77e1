"""The framing between the ``replay`` process and its ranks (``replay._wire``)."""

from __future__ import annotations

import io
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay import _wire

REPORT = {"digests": [{"op": "sgd", "digest": "ab" * 16}], "text": "x" * 9000, "n": 3}


def _read(lines: list[str]) -> _wire.FrameReader:
    reader = _wire.FrameReader()
    for line in lines:
        reader.feed(line)
    return reader


def test_a_report_survives_the_trip_in_frames_of_one_write_each() -> None:
    lines = _wire.frames(1, "error", REPORT)
    assert len(lines) > 1  # 9 kB of text takes several frames
    assert all(len(line.encode()) + 1 < 4096 for line in lines)  # under PIPE_BUF
    [report] = _read(lines).reports()
    assert (report.rank, report.kind, report.data) == (1, "error", REPORT)


@given(st.randoms(use_true_random=False))
def test_frames_of_two_ranks_in_any_order_between_other_lines(rnd: random.Random) -> None:
    a, b = _wire.frames(0, "result", REPORT), _wire.frames(1, "error", {"m": "no"})
    noise = [f"iter {k} rmse = 0.9" for k in range(5)]
    lines = a + b + noise
    rnd.shuffle(lines)
    reader = _wire.FrameReader()
    shown = [line for line in lines if not reader.feed(line)]
    assert sorted(shown) == sorted(noise)
    assert [(r.rank, r.kind) for r in reader.reports()] == [(0, "result"), (1, "error")]
    assert reader.incomplete() is None


def test_a_frame_cut_by_another_ranks_output_is_refused_not_trusted() -> None:
    lines = _wire.frames(0, "result", REPORT)
    cut = lines[1][:500] + "iter 3 rmse = 0.9" + lines[1][500:]
    reader = _read([lines[0], cut, *lines[2:]])
    with pytest.raises(_wire.FrameError, match="reached this process mangled"):
        reader.reports()
    # other output that is itself valid base64: the length and digest still catch it
    cut = lines[1][:500] + "QUJD" + lines[1][500:]
    reader = _read([lines[0], cut, *lines[2:]])
    with pytest.raises(_wire.FrameError, match="length or digest does not match"):
        reader.reports()


def test_a_frame_that_starts_inside_another_line_is_refused() -> None:
    lines = _wire.frames(0, "result", {"ok": True})
    reader = _read(["iter 3 rmse" + lines[0]])
    with pytest.raises(_wire.FrameError, match="started inside another line"):
        reader.reports()


def test_a_report_missing_a_frame_is_incomplete() -> None:
    lines = _wire.frames(1, "diverged", REPORT)
    reader = _read(lines[:-1])
    assert reader.reports() == []
    err = reader.incomplete()
    assert err is not None and "rank 1's diverged report reached this process incomplete" in str(
        err
    )


def test_the_spec_reaches_rank_0_in_pieces_it_asks_for() -> None:
    spec = {"app": "sgdmf", "orders_npz": "A" * 50_000}
    pieces = _wire.spec_pieces(spec)
    assert len(pieces) == 1 + 4 and all(len(p) <= _wire.SPEC_PIECE for p in pieces)
    acks: list[int] = []
    got = _wire.read_spec(io.BytesIO(b"".join(pieces)), acks.append)
    assert got == spec and acks == [0, 1, 2, 3, 4, 5]  # ready for the header, then each
    assert [_wire.parse_ack(_wire.ack_line(k)) for k in acks] == acks
    assert _wire.parse_ack("iter 1") is None


def test_a_damaged_or_missing_spec_is_one_clear_error() -> None:
    data = b"".join(_wire.spec_pieces({"app": "sgdmf"}))
    with pytest.raises(_wire.FrameError, match="damaged"):
        _wire.read_spec(io.BytesIO(data.replace(b"sgdmf", b"sgdmX")))
    with pytest.raises(_wire.FrameError, match="did not receive a job spec"):
        _wire.read_spec(io.BytesIO(json.dumps({"app": "x"}).encode()))
