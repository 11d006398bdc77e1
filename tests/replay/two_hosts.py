"""An ``mpiexec`` that emulates two hosts on this machine (tests/replay/test_multihost.py).

``two_hosts.py [GLOBAL OPTIONS] -n N CMD ...`` runs the real mpiexec as an MPMD launch::

    MPIEXEC [GLOBAL OPTIONS] -n 1 SIDE0 CMD ... : -n N-1 SIDE1 CMD ...

where each side runs in a mount and UTS namespace of its own (``unshare -m -u``): its own
host name (``emulated-host-K``: no rank is on the parent's host, so no rank can check the
parent's pid), its own ``TMPDIR`` and working directory, and an empty tmpfs over each
directory it must not see.  Rank 0 is side 0.

Environment: ``TWO_HOSTS_MPIEXEC`` (the real mpiexec), ``TWO_HOSTS_ROOT`` (holds
``side0/`` and ``side1/``, each with ``tmp/`` and ``cwd/``), ``TWO_HOSTS_HIDE0`` and
``TWO_HOSTS_HIDE1`` (directories each side must not see, separated by ``os.pathsep``),
``TWO_HOSTS_RO0`` and ``TWO_HOSTS_RO1`` (directories each side sees read-only).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

#: The shell script each side runs before the command (``$@``).
SIDE = """hostname {host} || exit 97
for d in {hide}; do mount -t tmpfs none "$d" || exit 98; done
for d in {readonly}; do mount --bind "$d" "$d" && mount -o remount,bind,ro "$d" || exit 96; done
cd {cwd} || exit 99
TMPDIR={tmp} exec "$@"
"""


def side(k: int, cmd: list[str]) -> list[str]:
    root = Path(os.environ["TWO_HOSTS_ROOT"]) / f"side{k}"
    tmp, cwd = root / "tmp", root / "cwd"
    tmp.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    hide = [d for d in os.environ.get(f"TWO_HOSTS_HIDE{k}", "").split(os.pathsep) if d]
    ro = [d for d in os.environ.get(f"TWO_HOSTS_RO{k}", "").split(os.pathsep) if d]
    script = SIDE.format(
        host=f"emulated-host-{k}",
        hide=" ".join(shlex.quote(d) for d in hide) or '""',
        readonly=" ".join(shlex.quote(d) for d in ro) or '""',
        cwd=shlex.quote(str(cwd)),
        tmp=shlex.quote(str(tmp)),
    )
    script = "\n".join(ln for ln in script.split("\n") if not ln.startswith('for d in ""'))
    return ["unshare", "-m", "-u", "--propagation", "private", "sh", "-c", script, "sh", *cmd]


def main(argv: list[str]) -> int:
    at = argv.index("-n")
    options, ranks, cmd = argv[:at], int(argv[at + 1]), argv[at + 2 :]
    real = os.environ["TWO_HOSTS_MPIEXEC"]
    line = [real, *options, "-n", "1", *side(0, cmd)]
    if ranks > 1:
        line += [":", "-n", str(ranks - 1), *side(1, cmd)]
    os.execv(real, line)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
