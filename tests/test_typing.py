"""mypy is clean on ``engine``, ``tracer`` and ``replay`` (configured in pyproject.toml)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None,
    reason="mypy is not installed (it is in the 'test' extra: pip install -e '.[test]')",
)
@pytest.mark.timeout(600)
def test_mypy_is_clean() -> None:
    # no arguments: the files and the strictness come from [tool.mypy] in pyproject.toml
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"mypy failed:\n{proc.stdout}{proc.stderr}"
