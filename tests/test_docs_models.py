"""docs/models.md's commands and program run as written (in this process)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np

from tests.conftest import ROOT

PAGE = ROOT / "docs" / "models.md"


def test_the_model_page_commands_run_as_written(cli: Any, tmp_path: Path) -> None:
    blocks = re.findall(r"```bash\n(.*?)\n```", PAGE.read_text(), re.S)
    lines = [ln for block in blocks for ln in block.splitlines()]
    assert len(lines) == 5, "docs/models.md lost its commands"
    for line in lines:
        words = shlex.split(line)
        if words[0] == "python":  # the page's numpy check, done here
            with np.load(tmp_path / "model.npz") as m:
                assert m["W"].shape[1] == m["H"].shape[1] == 32
            continue
        assert words[0] == "replay", line
        res = cli(*words[1:], cwd=tmp_path)
        assert res.returncode == 0, (line, res.stderr)
    with np.load(tmp_path / "after-epoch-1.npz") as first, np.load(tmp_path / "last.npz") as last:
        assert first.files == last.files == ["W", "H"]
        assert not np.array_equal(first["W"], last["W"])


def test_the_model_page_program_runs_as_written(cli: Any, tmp_path: Path) -> None:
    code = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert code is not None
    (tmp_path / "train.py").write_text(code.group(1))
    res = cli("run", "train.py:train", "--no-trace", "--save", "m.npz", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    with np.load(tmp_path / "weights.npz") as own, np.load(tmp_path / "m.npz") as saved:
        assert own["W"].shape == (100, 8) and np.array_equal(own["W"], saved["W"])
        assert own["names"][3] == "w3" and saved.files == ["W"]
