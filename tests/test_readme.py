"""The README's app example runs as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import ROOT, run_cli
from tests.pg import PASSWORD


def test_writing_an_app_example_runs(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Writing an app") :]
    code = re.search(r"```python\n(# train.py\n.*?)```", section, re.S).group(1)
    (tmp_path / "train.py").write_text(code)
    rows = [
        f"{u},{i},{1 + (u * 7 + i * 3) % 5}" for u in range(30) for i in range(20) if (u + i) % 3
    ]
    (tmp_path / "ratings.csv").write_text("\n".join(rows) + "\n")
    proc = run_cli(
        [
            "run",
            "train.py:train",
            "--ranks",
            "2",
            "-p",
            "epochs=3",
            "-p",
            "path=ratings.csv",
            "--json",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    rmse = json.loads(proc.stdout)["objectives"]["rmse"]
    assert len(rmse) == 3 and rmse[-1] < rmse[0]


def test_top_of_readme_has_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text().split("---")[0]
    cmds = re.findall(r"```bash\n(.*?)\n```", head, re.S)
    assert len(cmds) == 2
    assert cmds[0].endswith("replay demo")
    # .ci/run runs the README's command: the install line, then the static checks on
    # their own lines, then the test command last
    lines = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    install = next(line for line in lines if line.startswith("python3.11 -m venv"))
    assert f"{install} && {lines[-1]}" == cmds[1]


def test_postgres_commands_run_as_written(pg_url: str, tmp_path: Path, cli) -> None:
    """The README's PostgreSQL commands, with its example URL pointed at the test server
    (in this process: the arguments are the point; ``run`` and ``dual`` still start their
    ranks under mpiexec)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Trace stores in PostgreSQL") : text.index("## Writing an app")]
    blocks = re.findall(r"```bash\n(.*?)\n```", section, re.S)
    example = "postgresql+psycopg://me:secret@localhost/traces"
    lines = blocks[1].splitlines()
    assert all(line.startswith("replay ") and example in line for line in lines)
    assert "replay browse " + example in lines  # the browser needs a terminal: tests/tui
    for line in lines:
        if line.startswith("replay browse"):
            continue
        args = line.replace(example, pg_url).split()[1:]
        proc = cli(*args, cwd=tmp_path)
        assert proc.returncode == 0, (line, proc.stderr)
        assert PASSWORD not in proc.stdout + proc.stderr
    assert (tmp_path / "sgdmf-timeline.json").is_file()
