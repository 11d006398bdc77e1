"""Every file the product writes is created safely (issue 33): through a temporary name it
creates exclusively, never through a link, never over a device, FIFO, directory, trace
store or a trace's ``-wal``/``-shm``/``-journal``, and a new trace store is created
exclusively so two runs cannot share one.

Each case snapshots the directory (kinds, link targets, bytes) and checks that whatever
existed before is byte-for-byte unchanged after, and that no temporary file is left.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import engine as ap
from replay import _cliutil, _runcmds
from replay._cli import cli
from replay._errors import UsageError

SGD = ["-p", "synthetic=true", "-p", "epochs=1"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real trace (read-only: tests copy it)."""
    path = tmp_path_factory.mktemp("recorded") / "t.sqlite"
    res = CliRunner().invoke(cli, ["run", "sgdmf", *SGD, "--trace", str(path)])
    assert res.exit_code == 0, res.output
    return path


def invoke(argv: list[str]) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, argv)
    return res.exit_code, res.stdout, res.stderr


def snapshot(d: Path) -> dict[str, tuple[str, Any]]:
    """What each name in ``d`` is: a link and its target text, a file and its bytes, ..."""
    out: dict[str, tuple[str, Any]] = {}
    for name in sorted(os.listdir(d)):
        p = d / name
        mode = os.lstat(p).st_mode
        if stat.S_ISLNK(mode):
            out[name] = ("link", os.readlink(p))
        elif stat.S_ISREG(mode):
            out[name] = ("file", p.read_bytes())
        elif stat.S_ISDIR(mode):
            out[name] = ("dir", snapshot(p))
        else:
            out[name] = ("special", stat.S_IFMT(mode))
    return out


def one_error_line(rc: int, err: str, fragment: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("replay: error:"), err
    assert fragment in lines[0], err


# ---------------------------------------------------------------- target kinds
#: name -> (setup(dir, trace) -> output path, --force?, expected fragment or None for success)
Setup = Callable[[Path, Path], Path]


def _copy(trace: Path, d: Path, name: str = "other.sqlite") -> Path:
    dst = d / name
    shutil.copyfile(trace, dst)
    return dst


def _absent(d: Path, trace: Path) -> Path:
    return d / "out.json"


def _regular(d: Path, trace: Path) -> Path:
    (d / "out.json").write_text("keep")
    return d / "out.json"


def _link_to_trace(d: Path, trace: Path) -> Path:
    (d / "out.json").symlink_to(_copy(trace, d))
    return d / "out.json"


def _link_to_file(d: Path, trace: Path) -> Path:
    (d / "precious.txt").write_text("precious")
    (d / "out.json").symlink_to(d / "precious.txt")
    return d / "out.json"


def _dangling(d: Path, trace: Path) -> Path:
    (d / "out.json").symlink_to(d / "nowhere.json")
    return d / "out.json"


def _tmp_links(d: Path, trace: Path) -> Path:
    """Links at every predictable temporary name, each to a trace store."""
    store = _copy(trace, d)
    for name in ("out.json.tmp", "out.tmp", ".out.json.tmp", ".out.json", ".out.json.part"):
        (d / name).symlink_to(store)
    return d / "out.json"


def _fifo(d: Path, trace: Path) -> Path:
    os.mkfifo(d / "out.json")
    return d / "out.json"


def _chardev(d: Path, trace: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("making a character device (like /dev/null) needs root; CI runs as root")
    os.mknod(d / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return d / "null"


def _directory(d: Path, trace: Path) -> Path:
    (d / "out.json").mkdir()
    (d / "out.json" / "inside.txt").write_text("inside")
    return d / "out.json"


def _store(d: Path, trace: Path) -> Path:
    return _copy(trace, d)


def _sidecar(suffix: str, present: bool) -> Setup:
    def setup(d: Path, trace: Path) -> Path:
        store = _copy(trace, d)
        side = Path(f"{store}{suffix}")
        if present:
            side.write_bytes(b"committed rows\x00" * 64)
        return side

    return setup


def _missing_dir(d: Path, trace: Path) -> Path:
    return d / "nodir" / "x.json"


REFUSED_LINK = "symbolic link"
CASES: dict[str, tuple[Setup, bool, str | None]] = {
    "absent": (_absent, False, None),
    "regular": (_regular, False, "already exists; pass --force"),
    "regular-force": (_regular, True, None),
    "link-to-trace": (_link_to_trace, True, "is a"),  # a trace store, or a link: refused
    "link-to-file": (_link_to_file, True, REFUSED_LINK),
    "dangling-link": (_dangling, True, REFUSED_LINK),
    "tmp-name-links": (_tmp_links, False, None),
    "fifo": (_fifo, True, "FIFO"),
    "char-device": (_chardev, True, "character device"),
    "directory": (_directory, True, "directory"),
    "trace-store": (_store, True, "trace store"),
    **{
        f"{s[1:]}-{'present' if p else 'absent'}": (_sidecar(s, p), True, f"SQLite's {s}")
        for s in ("-wal", "-shm", "-journal")
        for p in (True, False)
    },
    "missing-dir": (_missing_dir, False, "does not exist; create it or pass another path"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_export_output_kinds(case: str, trace: Path, tmp_path: Path) -> None:
    setup, force, fragment = CASES[case]
    d = tmp_path / "d"
    d.mkdir()
    out = setup(d, trace)
    before = snapshot(d)
    argv = ["export", str(trace), "--format", "chrome", "-o", str(out)]
    rc, stdout, err = invoke(argv + (["--force"] if force else []))
    after = snapshot(d)
    if fragment is None:
        assert rc == 0, err
        assert "Traceback" not in err and err.strip() == ""
        assert after.pop(out.name)[0] == "file" and b"traceEvents" in out.read_bytes()
        before.pop(out.name, None)
        assert after == before  # links at temporary names untouched, nothing left over
    else:
        one_error_line(rc, err, fragment)
        assert after == before
    assert not any(n.endswith(".tmp") for n in after if n not in before)


def test_missing_directory_is_named(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "nodir" / "x.json"
    rc, _, err = invoke(["export", str(trace), "-o", str(out)])
    one_error_line(rc, err, "")
    assert err.strip() == (
        f"replay: error: -o {out}: directory {out.parent} does not exist; "
        "create it or pass another path"
    )


def test_export_never_writes_a_wal_holding_committed_rows(trace: Path, tmp_path: Path) -> None:
    store = _copy(trace, tmp_path, "live.sqlite")
    db = sqlite3.connect(store)  # held open: the WAL keeps its committed, uncheckpointed rows
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA wal_autocheckpoint=0")
        db.execute("CREATE TABLE probe_rows (x)")
        db.execute("INSERT INTO probe_rows VALUES ('kept')")
        db.commit()
        wal = Path(f"{store}-wal")
        before = wal.read_bytes()
        assert before
        rc, _, err = invoke(["export", str(trace), "-o", str(wal), "--force"])
        one_error_line(rc, err, "-wal")
        assert wal.read_bytes() == before
    finally:
        db.close()
    with sqlite3.connect(store) as again:
        assert again.execute("SELECT x FROM probe_rows").fetchall() == [("kept",)]


# ---------------------------------------------------------------- the helper itself
def test_write_file_removes_its_temporary_on_failure(tmp_path: Path) -> None:
    from engine.lowlevel import replacing

    with pytest.raises(RuntimeError), replacing(tmp_path / "x.txt") as fh:
        fh.write(b"half")
        raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_no_force_never_replaces_a_file_created_meanwhile(tmp_path: Path) -> None:
    from engine.lowlevel import replacing

    out = tmp_path / "x.txt"
    with pytest.raises(ap.OutputPathError, match="already exists"):  # noqa: PT012
        with replacing(out) as fh:
            fh.write(b"mine")
            out.write_text("theirs")  # another process, between the check and the rename
    assert out.read_text() == "theirs" and os.listdir(tmp_path) == ["x.txt"]


# ---------------------------------------------------------------- ap.store
STORE_CASES = {
    k: CASES[k]
    for k in (
        "absent",
        "tmp-name-links",
        "link-to-file",
        "dangling-link",
        "fifo",
        "char-device",
        "directory",
        "trace-store",
        "wal-absent",
        "wal-present",
        "missing-dir",
    )
}


@pytest.mark.parametrize("case", list(STORE_CASES))
def test_ap_store_output_kinds(case: str, trace: Path, tmp_path: Path) -> None:
    setup, _, fragment = STORE_CASES[case]
    out = setup(tmp_path, trace)
    before = snapshot(tmp_path)

    def prog() -> None:
        ap.store(ap.create(2, lambda i: float(i), name="X"), out)

    if fragment is None:
        ap.run(prog, nodes=1)
        assert out.read_text() == "0\t0.0\n1\t1.0\n"
        after = snapshot(tmp_path)
        after.pop(out.name)
        assert after == before
        return
    with pytest.raises(ap.OutputPathError) as info:
        ap.run(prog, nodes=1)
    message = str(info.value)
    assert message.startswith(f"ap.store path {out}") and "\n" not in message
    assert fragment in message or "is a" in message
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------- new trace stores
TRACE_KINDS = {
    k: CASES[k]
    for k in (
        "regular",
        "link-to-file",
        "dangling-link",
        "fifo",
        "char-device",
        "directory",
        "trace-store",
        "wal-absent",
        "wal-present",
    )
}


@pytest.mark.parametrize("case", list(TRACE_KINDS))
def test_run_trace_refuses_anything_existing(case: str, trace: Path, tmp_path: Path) -> None:
    setup = TRACE_KINDS[case][0]
    target = setup(tmp_path, trace)
    before = snapshot(tmp_path)
    rc, _, err = invoke(["run", "sgdmf", *SGD, "--trace", str(target)])
    one_error_line(rc, err, "trace")
    assert snapshot(tmp_path) == before


def test_a_leftover_wal_beside_a_new_trace_is_refused(tmp_path: Path) -> None:
    Path(f"{tmp_path / 'new.sqlite'}-wal").write_bytes(b"stale")
    before = snapshot(tmp_path)
    rc, _, err = invoke(["run", "sgdmf", *SGD, "--trace", str(tmp_path / "new.sqlite")])
    one_error_line(rc, err, "leftover")
    assert snapshot(tmp_path) == before


def test_two_threads_reserving_one_trace_one_wins(tmp_path: Path) -> None:
    path = str(tmp_path / "same.sqlite")
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def one() -> None:
        barrier.wait()
        try:
            _cliutil.trace_path("sgdmf", path)
            outcomes.append("won")
        except UsageError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes)[-1] == "won" and outcomes.count("won") == 1, outcomes
    assert "already exists" in min(outcomes)


def test_concurrent_runs_on_one_trace_exactly_one_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second run's check happens after the first run's, before the first records:
    the moment a check-then-create let both through."""
    path = tmp_path / "same.sqlite"
    second: list[str] = []
    real = _runcmds.trace_path

    def first_then_second(app: str, given: str | None) -> str:
        got = real(app, given)
        try:
            real(app, given)
            second.append("accepted")
        except UsageError as exc:
            second.append(str(exc))
        return got

    monkeypatch.setattr(_runcmds, "trace_path", first_then_second)
    rc, _, err = invoke(["run", "sgdmf", *SGD, "--trace", str(path)])
    assert rc == 0, err
    assert len(second) == 1 and "already exists" in second[0], second
    # and the command line says so in one line once the store is there
    monkeypatch.setattr(_runcmds, "trace_path", real)
    rc, _, err = invoke(["run", "sgdmf", *SGD, "--trace", str(path)])
    one_error_line(rc, err, "already exists")
    # a run that fails before recording gives its new path back (no empty trace is left)
    fresh = tmp_path / "fresh.sqlite"
    rc, _, err = invoke(["run", "sgdmf", "-p", "nosuch=1", "--trace", str(fresh)])
    assert rc == 2 and "Traceback" not in err
    assert not os.path.lexists(fresh)


def test_cluster_trace_out_is_reserved_too(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.sqlite"
    out.symlink_to(tmp_path / "elsewhere.sqlite")  # dangling: SQLite would create its target
    before = snapshot(tmp_path)
    rc, _, err = invoke(["cluster", str(trace), "--trace-out", str(out)])
    one_error_line(rc, err, "already exists")
    assert snapshot(tmp_path) == before


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(tmp_path)  # a default-named trace lands here, never in the repo
    yield
