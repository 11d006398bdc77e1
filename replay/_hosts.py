"""Where an MPI job's ranks run: the host file, hydra's launcher, a Slurm allocation.

``--hostfile FILE`` and ``--launcher NAME`` (``_cliutil.host_options``) become a
:class:`Placement` for the duration of one command; every launch of that command
(``replay run``, ``cluster``, ``resume``, ``dual``, ``chaos``: all through
``_job.launch``) builds its ``mpiexec`` command line with :func:`mpiexec_command`.
Inside a Slurm allocation (``SLURM_JOB_ID`` with ``SLURM_NTASKS`` or
``SLURM_JOB_NODELIST``) hydra is told ``-launcher slurm`` unless the user chose a
launcher, ``--ranks`` defaults to the allocation's tasks, and more ranks than it has are
refused before anything starts.

Everything here is a pure function of its arguments (the environment is passed in),
so that the command lines can be tested without a cluster; the one exception is
:func:`unresolvable_host`, which asks the resolver about the host file's names after a
launch failed and mpiexec's ssh said nothing we could read.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ._errors import UsageError


@dataclass(frozen=True, slots=True)
class Placement:
    """How the user asked for the ranks to be placed (None: mpiexec's default)."""

    hostfile: str | None = None
    launcher: str | None = None


_PLACEMENT: contextvars.ContextVar[Placement | None] = contextvars.ContextVar(
    "replay_placement", default=None
)


def current_placement() -> Placement:
    """The placement of the command that runs now (the default outside one)."""
    return _PLACEMENT.get() or Placement()


@contextlib.contextmanager
def placed(placement: Placement) -> Iterator[None]:
    """Make ``placement`` current for the launches inside the block."""
    token = _PLACEMENT.set(placement)
    try:
        yield
    finally:
        _PLACEMENT.reset(token)


def set_placement(placement: Placement) -> None:
    """Make ``placement`` current until the command ends (``_cliutil.Group`` resets it)."""
    _PLACEMENT.set(placement)


def _host_lines(path: str) -> list[str]:
    """The lines of host file ``path``, each without its comment and outer spaces."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [ln.split("#", 1)[0].strip() for ln in f]


def _host_of(line: str) -> str:
    """The host a (non-empty) host file line names: ``host[:slots...] [key=value ...]``."""
    return line.split()[0].partition(":")[0]


def check_hostfile(path: str) -> str:
    """``path`` if it is a host file mpiexec can read, else one :class:`UsageError` line."""
    try:
        hosts = _host_lines(path)
    except FileNotFoundError:
        raise UsageError(
            f"--hostfile {path}: no such file; give a file with one host per line"
        ) from None
    except IsADirectoryError:
        raise UsageError(
            f"--hostfile {path} is a directory; give a file with one host per line"
        ) from None
    except OSError as exc:
        raise UsageError(f"--hostfile {path} cannot be read: {exc.strerror}") from None
    if not any(hosts):
        raise UsageError(
            f"--hostfile {path} names no host; write one host per line (host or host:slots)"
        )
    for lineno, line in enumerate(hosts, start=1):
        why = _bad_host_line(line)
        if why is not None:
            shown = line if len(line) <= 60 else line[:57] + "..."
            raise UsageError(
                f"--hostfile {path}, line {lineno}: {shown!r} {why}; write one host per "
                "line, as host or host:slots (slots a whole number of at least 1)"
            )
    return os.path.abspath(path)


def _bad_host_line(line: str) -> str | None:
    """Why hydra cannot use this host file line (comment stripped), or None: mpiexec
    itself dies on a signal (``host:0``, ``host:abc``), stops parsing (a host with a
    space), or waits forever (``host:-1``) on such lines."""
    if not line:
        return None
    first, *extra = line.split()
    if any("=" not in token for token in extra):  # hydra's own ``key=value`` options pass
        return "has a space in a host name"
    host, rest = _host_of(line), first.partition(":")[2]
    if not host:
        return "names no host before ':'"
    if rest or first.endswith(":"):
        slots = rest.split(":", 1)[0]
        if not (slots.isascii() and slots.isdigit()) or int(slots) < 1:
            return f"gives {slots!r} slots"
    return None


# ====================================================================== Slurm
def slurm_tasks(env: Mapping[str, str]) -> int | None:
    """The number of tasks of the Slurm allocation this process runs in (None: none)."""
    if not env.get("SLURM_JOB_ID"):
        return None
    if not (env.get("SLURM_NTASKS") or env.get("SLURM_JOB_NODELIST")):
        return None
    for key in ("SLURM_NTASKS", "SLURM_NPROCS"):
        text = env.get(key, "")
        if text.isdigit() and int(text) > 0:
            return int(text)
    return None


def in_slurm(env: Mapping[str, str]) -> bool:
    """Whether ``env`` is that of a process inside a Slurm allocation."""
    return bool(env.get("SLURM_JOB_ID")) and bool(
        env.get("SLURM_NTASKS") or env.get("SLURM_JOB_NODELIST")
    )


def default_ranks(env: Mapping[str, str]) -> int:
    """``--ranks`` when not given: the allocation's tasks under Slurm, else 1."""
    return slurm_tasks(env) or 1


def check_allocation(
    ranks: int, env: Mapping[str, str], *, what: str = "--ranks", recorded: bool = False
) -> None:
    """Refuse more ranks than the Slurm allocation has tasks (one line, before a start).
    ``recorded``: the ranks are a trace's (a replay or resume), not the user's choice."""
    tasks = slurm_tasks(env)
    if tasks is not None and ranks > tasks:
        job = env.get("SLURM_JOB_ID")
        ask = f"'salloc -n {ranks}' (or 'sbatch -n {ranks}')"
        if recorded:
            raise UsageError(
                f"the run was recorded on {ranks} ranks, more than the {tasks} task(s) of "
                f"Slurm job {job}, and replays and resumes run on the recorded ranks: ask "
                f"for {ranks} with {ask}"
            )
        raise UsageError(
            f"{what} {ranks} is more than the {tasks} task(s) of Slurm job {job}; ask for "
            f"more with {ask}, or use fewer ranks"
        )


# ====================================================================== command line
def mpiexec_command(
    mpiexec: str,
    ranks: int,
    argv: list[str],
    placement: Placement,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The command line that starts ``argv`` on ``ranks`` ranks (hydra's options).

    >>> mpiexec_command("mpiexec", 2, ["python"], Placement("hosts", None), env={})
    ['mpiexec', '-f', 'hosts', '-n', '2', 'python']
    """
    env = os.environ if env is None else env
    cmd = [mpiexec]
    if placement.hostfile is not None:
        cmd += ["-f", placement.hostfile]
    launcher = placement.launcher
    if launcher is None and in_slurm(env):
        launcher = "slurm"
    if launcher is not None:
        cmd += ["-launcher", launcher]
    return [*cmd, "-n", str(ranks), *argv]


#: Seconds ssh may take to connect to a host and exchange banners before hydra gives up
#: on it.  ssh's own default waits for the kernel's TCP timeout (two minutes and more) on
#: a host whose packets are dropped, and for ever on one that accepts and says nothing;
#: 30 s leaves room for a slow login node or a jump host.
SSH_CONNECT_TIMEOUT_S = 30


def launcher_env(placement: Placement, env: Mapping[str, str]) -> dict[str, str]:
    """What mpiexec's environment gains for ``placement``: with the ssh launcher, a
    connect timeout (:data:`SSH_CONNECT_TIMEOUT_S`), unless the user passes ssh options
    to hydra already (``HYDRA_LAUNCHER_EXTRA_ARGS``)."""
    launcher = (
        placement.launcher or env.get("HYDRA_LAUNCHER") or ("slurm" if in_slurm(env) else "ssh")
    )
    if launcher != "ssh" or "HYDRA_LAUNCHER_EXTRA_ARGS" in env:
        return {}
    return {"HYDRA_LAUNCHER_EXTRA_ARGS": f"-o ConnectTimeout={SSH_CONNECT_TIMEOUT_S:d}"}


#: What hydra's ssh launcher prints when it cannot reach a host (the last: a host that
#: let ssh wait past its ``ConnectTimeout``).
_SSH_FAILURE = re.compile(
    r"ssh: (?:Could not resolve hostname (?P<name>\S+?):|connect to host (?P<host>\S+) port "
    r"\d+:)\s*(?P<why>.*)|^Connection to (?P<slow>\S+) port \d+ (?P<late>timed out)"
)


#: What hydra prints when it cannot execute a program: its launcher (``[mpiexec@host]``:
#: ``srun``, ``rsh``, ...; hydra then waits for ever) or the ranks' Python on a host
#: (``[proxy:N@host]``).
_EXEC_FAILURE = re.compile(
    r"^\[(?P<who>mpiexec|proxy:[^@\]]*)@(?P<host>[^\]]*)\].*execvp error on file "
    r"(?P<file>\S+) \((?P<why>[^)]*)\)"
)


def launcher_cannot_run(line: str) -> bool:
    """Whether ``line`` is mpiexec saying it cannot execute its launcher, after which
    it waits for ever (hydra 4-5): the job must be ended, not waited for."""
    m = _EXEC_FAILURE.search(line)
    return m is not None and m.group("who") == "mpiexec"


def exec_failure(err_lines: list[str], env: Mapping[str, str] | None = None) -> str | None:
    """One line naming the program mpiexec could not execute (None: no such line)."""
    for line in err_lines:
        m = _EXEC_FAILURE.search(line)
        if m is None:
            continue
        file, why = m.group("file"), m.group("why")
        if m.group("who") != "mpiexec":  # a host's proxy could not start a rank
            return (
                f"host {m.group('host')} cannot run {file} ({why}); every host needs the "
                "same Python environment at the same path (docs/cluster.md)"
            )
        if file == "srun" and in_slurm(os.environ if env is None else env):
            hint = (
                "SLURM_JOB_ID is set but srun is not on PATH: run inside the allocation, "
                "or pass --launcher (fork on this host only, ssh across hosts)"
            )
        else:
            hint = "install it or add it to PATH, or choose another --launcher"
        return f"mpiexec cannot run its launcher {file} ({why}); {hint}"
    return None


#: hydra's own lines: ``[mpiexec@HOST] FUNCTION (FILE:LINE): WHAT``.
_HYDRA_LINE = re.compile(r"^\[mpiexec@[^\]]*\] \S+ \([^)]*\): (?P<what>.+)$")
_UNKNOWN_LAUNCHER = re.compile(r"unrecognized launcher: (?P<name>\S+)")


def launcher_failure(err_lines: list[str]) -> str | None:
    """One line for a launcher that hydra does not have, or that could not start the
    ranks (outside its scheduler's job, say); None when no line says so.  Without it the
    job read as 'a rank died after 0.0 s'."""
    for line in err_lines:
        m = _UNKNOWN_LAUNCHER.search(line)
        if m is not None:
            return (
                f"this mpiexec has no launcher {m.group('name')} (its hydra was built "
                "without it; 'mpiexec -h' lists those it has); choose another --launcher"
            )
    if any("launcher cannot launch processes" in line for line in err_lines):
        first = next((m for ln in err_lines if (m := _HYDRA_LINE.search(ln))), None)
        why = first.group("what").strip() if first is not None else "no reason given"
        return (
            f"mpiexec's launcher could not start the ranks ({why}); check --launcher, and "
            "run inside that scheduler's job if it needs one"
        )
    return None


def unreachable_host(
    err_lines: list[str], hostfile: str | None = None, env: Mapping[str, str] | None = None
) -> str | None:
    """One line naming the host mpiexec could not start a rank on, or the program it
    could not execute to do so (None: no such line).

    ``hostfile`` (the job's ``--hostfile``) lets a bare "Launch proxy failed" name a host
    whose name does not resolve.
    """
    missing = exec_failure(err_lines, env) or launcher_failure(err_lines)
    if missing is not None:
        return missing
    for line in err_lines:
        m = _SSH_FAILURE.search(line)
        if m is not None and m.group("slow"):
            why = f"no answer from its ssh within {SSH_CONNECT_TIMEOUT_S} s"
            return _cannot_reach(m.group("slow"), why)
        if m is not None:
            host = m.group("name") or m.group("host")
            return _cannot_reach(host, m.group("why").strip().rstrip(".") or "unreachable")
    if any("Launch proxy failed" in line for line in err_lines):
        # ssh's own line can be lost: hydra may end it before it prints. A name the
        # resolver does not know is then the cause we can still name.
        named = unresolvable_host(hostfile) if hostfile is not None else None
        if named is not None:
            return _cannot_reach(*named)
        return (
            "mpiexec could not start its proxy on a host of the job (see --hostfile and "
            "--launcher); check every host is up and reachable with the chosen launcher"
        )
    return None


def _cannot_reach(host: str, why: str) -> str:
    return (
        f"mpiexec cannot reach host {host} ({why}); fix that host in the host file or check "
        "it is up and accepts ssh without a password"
    )


#: How long the names of a host file may take to resolve, all together (seconds).
RESOLVE_WAIT_S = 5.0


def unresolvable_host(hostfile: str) -> tuple[str, str] | None:
    """The first host of ``hostfile`` whose name does not resolve, with the resolver's
    reason (None: every name resolves, the file cannot be read, or resolving took longer
    than :data:`RESOLVE_WAIT_S`)."""
    try:
        hosts = list(dict.fromkeys(_host_of(ln) for ln in _host_lines(hostfile) if ln))
    except OSError:
        return None
    found: list[tuple[str, str]] = []

    def resolve() -> None:
        for host in hosts:
            try:
                socket.getaddrinfo(host, None)
            except (OSError, UnicodeError) as exc:
                found.append((host, getattr(exc, "strerror", None) or "unknown host"))
                return

    worker = threading.Thread(target=resolve, daemon=True)  # a stuck resolver is left
    worker.start()
    worker.join(RESOLVE_WAIT_S)
    return found[0] if found else None


__all__ = [
    "Placement",
    "check_allocation",
    "check_hostfile",
    "current_placement",
    "default_ranks",
    "exec_failure",
    "in_slurm",
    "launcher_cannot_run",
    "launcher_env",
    "launcher_failure",
    "mpiexec_command",
    "placed",
    "set_placement",
    "slurm_tasks",
    "unreachable_host",
    "unresolvable_host",
]
