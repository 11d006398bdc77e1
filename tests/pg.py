"""A real PostgreSQL server for the tests, started from the system's binaries.

``initdb`` makes a cluster in a temporary directory, ``pg_ctl`` starts it on
127.0.0.1 and a free port (its unix socket stays in that directory too), and the
server is stopped and the directory removed when the session ends.  The cluster
authenticates with a password (scram-sha-256) so the tests that check that a
password never shows can see a real one being used.  Where no server binary exists
the fixtures skip with the reason; CI installs Debian's ``postgresql`` (``.ci/run``).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The login the tests use, and its password (distinctive, so a leak is easy to find).
USER = "replay"
PASSWORD = "pw-Zq7sEcret-914"
#: Seconds ``pg_ctl`` waits for the server to start or stop.
START_TIMEOUT = 60
#: The unprivileged account that runs the server when the tests run as root.
SERVER_ACCOUNT = "postgres"


def find_bindir() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, if any."""
    on_path = shutil.which("initdb")
    dirs = [Path(on_path).parent] if on_path else []
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    dirs += [Path(d) for d in sorted(versions, key=_version, reverse=True)]
    for d in dirs:
        if all((d / exe).is_file() for exe in ("initdb", "pg_ctl", "postgres")):
            return d
    return None


def _version(bindir: str) -> float:
    try:
        return float(Path(bindir).parent.name)
    except ValueError:
        return 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running server: ``url(db)`` gives a password-bearing SQLAlchemy URL."""

    port: int
    root: Path

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        dsn = f"host=127.0.0.1 port={self.port} user={USER} password={PASSWORD} dbname=postgres"
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _skip(reason: str) -> None:
    """Skip with ``reason``; fail instead where a server is required (CI sets
    ``REPLAY_REQUIRE_POSTGRES=1``, so a missing server cannot pass as skipped)."""
    if os.environ.get("REPLAY_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"REPLAY_REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(reason)


def _as_server(cmd: list[str]) -> list[str]:
    """``cmd`` run as an unprivileged account when we are root (initdb refuses root)."""
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", SERVER_ACCOUNT, "--", *cmd]


def start_server() -> Iterator[Server]:
    """Start a throw-away server; stop it and remove its files when the generator ends."""
    try:
        import psycopg  # noqa: F401 - the tests talk to it through psycopg
    except ImportError:
        _skip("psycopg is not installed (pip install 'strads-replay[postgres]')")
    bindir = find_bindir()
    if bindir is None:
        _skip(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) on PATH or in "
            "/usr/lib/postgresql/*/bin: install Debian's 'postgresql' package"
        )
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam(SERVER_ACCOUNT)
        except KeyError:
            _skip(f"running as root and there is no {SERVER_ACCOUNT!r} account for initdb")
        if shutil.which("runuser") is None:
            _skip("running as root and 'runuser' is missing to start PostgreSQL")
    root = Path(tempfile.mkdtemp(prefix="replay-pg-"))
    data, log, pwfile = root / "data", root / "server.log", root / "pwfile"
    pwfile.write_text(PASSWORD + "\n")
    if owner is not None:
        for p in (root, pwfile):
            os.chown(p, owner.pw_uid, owner.pw_gid)
    port = _free_port()
    started = False
    try:
        _run(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                "--auth=scram-sha-256",
                f"--pwfile={pwfile}",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        )
        opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        opts += " -c max_connections=200"
        _run(
            [str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(log), "-w"]
            + ["-t", str(START_TIMEOUT), "start"]
        )
        started = True
        yield Server(port=port, root=root)
    finally:
        if started:
            _run(
                [str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w"]
                + ["-t", str(START_TIMEOUT), "stop"],
                check=False,
            )
        shutil.rmtree(root, ignore_errors=True)


def _run(cmd: list[str], *, check: bool = True) -> None:
    proc = subprocess.run(
        _as_server(cmd), capture_output=True, text=True, timeout=START_TIMEOUT + 30
    )
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{Path(cmd[0]).name} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}"
        )


__all__ = ["PASSWORD", "USER", "Server", "find_bindir", "start_server"]
