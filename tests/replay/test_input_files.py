"""A data file's path comes from the user's parameters and, in a replay, from the trace's,
which is hostile input: it must never make a command block or read without end.

Every reader of a user's file (``ap.load`` for SGDMF's ratings, the text reader of LDA,
Word2vec and TransE, the table reader of MLR and Lasso in text and NumPy form) takes a
regular file only, and no more of it than its size at the open.  A FIFO would block the
open for a writer that never comes, ``/dev/zero`` or ``/dev/urandom`` would never end a
line (a run on ``data=/dev/zero`` grew until memory ran out), a directory is not data.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

import engine as ap
from engine import InputFileError
from tests.tracer.tracehelp import reseal

#: (app, parameter, file name): each reader of a user's file.
READERS = [
    ("sgdmf", "data", "ratings.txt"),
    ("lda", "corpus", "docs.txt"),
    ("word2vec", "data", "sentences.txt"),
    ("mlr", "data", "table.csv"),
    ("lasso", "data", "table.npz"),
]


def _special(tmp_path: Path, kind: str, name: str) -> str:
    if kind == "fifo":
        path = tmp_path / name
        os.mkfifo(path)
        return str(path)
    if kind == "dir":
        path = tmp_path / name
        path.mkdir()
        return str(path)
    link = tmp_path / name  # a name the reader takes (its suffix), leading to /dev/zero
    link.symlink_to("/dev/zero")
    return str(link)


@pytest.mark.parametrize("kind", ["fifo", "chardev", "dir"])
@pytest.mark.parametrize("app,param,name", READERS)
def test_a_file_that_is_not_regular_is_one_line_and_nothing_waits(
    tmp_path: Path, cli, app: str, param: str, name: str, kind: str
) -> None:
    path = _special(tmp_path, kind, name)
    proc = cli("run", app, "-p", f"{param}={path}", "--no-trace", cwd=tmp_path)
    what = {"fifo": "a FIFO (named pipe)", "chardev": "a character device", "dir": "a directory"}
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"it is {what[kind]}, not a regular file" in proc.stderr, proc.stderr


def test_a_forged_trace_cannot_send_a_replay_to_a_device_or_a_pipe(tmp_path: Path, cli) -> None:
    """A re-sealed trace whose data path was edited: the replay refuses the path in one
    line instead of reading /dev/zero until memory runs out or waiting on a FIFO."""
    ratings = tmp_path / "mini.txt"
    ratings.write_text(
        "".join(f"{u + 1}\t{i + 1}\t{(u + i) % 5 + 1}\t0\n" for u in range(4) for i in range(3))
    )
    trace = tmp_path / "t.sqlite"
    rec = cli("run", "sgdmf", "-p", f"data={ratings}", "-p", "epochs=1", "--trace", str(trace))
    assert rec.returncode == 0, rec.stderr
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    for target in ("/dev/zero", str(fifo)):
        with sqlite3.connect(trace) as db:
            (text,) = db.execute("SELECT params FROM run").fetchone()
            db.execute(
                "UPDATE run SET params = ?", (json.dumps(json.loads(text) | {"data": target}),)
            )
        db.close()
        reseal(trace)
        proc = cli("single", str(trace))
        assert proc.returncode == 2 and "not a regular file" in proc.stderr, proc.stderr


def test_a_file_that_grows_while_it_is_read_is_refused(tmp_path: Path) -> None:
    """No more than the size at the open: a file appended to as it is read (a log still
    being written, or a path swapped under the reader) ends the read in one line."""
    path = tmp_path / "growing.txt"
    path.write_text("1\n2\n3\n")

    def parse(line: str) -> int:
        with path.open("a") as f:  # each parsed line makes the file longer
            f.write("4\n")
        return int(line)

    with pytest.raises(InputFileError, match="grew while it was read"):
        ap.run(lambda: ap.load(path, parse=parse, name="n"))
