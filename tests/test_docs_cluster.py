"""docs/cluster.md's commands run as written (one machine: localhost and ``fork``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

#: Seconds one documented command may take.
TIMEOUT = 240


@pytest.mark.mpi
def test_the_cluster_page_commands_run_as_written(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "cluster.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", text, re.S)
    assert blocks, "docs/cluster.md lost its commands"
    env = dict(
        os.environ,
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        PYTHONPATH=str(ROOT),
    )
    env.pop("REPLAY_MPIEXEC", None)
    for line in (ln for block in blocks for ln in block.splitlines()):
        proc = subprocess.run(
            ["sh", "-c", line],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert proc.returncode == 0, (line, proc.stderr)
    assert proc.stdout.startswith("ok:"), proc.stdout  # the last: replay verify
    # the page's example of an unreachable host prints what the page says it prints
    shown = re.search(
        r"```text\n\$ (printf .*?)\n\$ (replay .*?)\n(replay: error: .*?)\n```", text, re.S
    )
    assert shown is not None
    subprocess.run(["sh", "-c", shown.group(1)], cwd=tmp_path, check=True)
    proc = subprocess.run(
        ["sh", "-c", shown.group(2)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1] == shown.group(3), proc.stderr
