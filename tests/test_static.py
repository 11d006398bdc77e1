"""The static checks cover all the code: what ``mypy``, as .ci/run runs it, is told to check."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.conftest import ROOT

#: Top-level directories of Python code that mypy does not check, with the reason.
UNCHECKED = {"tests": "test code: typed where it helps, not held to the library's rules"}


def _code_directories(root: Path) -> set[str]:
    """Every top-level directory holding Python files (not hidden ones such as .venv)."""
    return {
        d.name
        for d in root.iterdir()
        if d.is_dir() and not d.name.startswith(".") and next(d.rglob("*.py"), None) is not None
    }


def test_mypy_checks_every_code_directory() -> None:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        files = tomllib.load(fh)["tool"]["mypy"]["files"]
    found = _code_directories(ROOT)
    assert {"engine", "benchmarks", "tests"} <= found  # the scan sees the tree
    missing = found - set(UNCHECKED) - set(files)
    assert not missing, f"add {sorted(missing)} to [tool.mypy] files in pyproject.toml"
    # the directories issue 39 names, so that a directory dropped from the disk and from
    # the list together is noticed too
    assert {"engine", "tracer", "replay", "tui", "apps", "benchmarks"} <= set(files)


def test_ci_runs_mypy_on_the_configured_files() -> None:
    """``mypy PATH...`` would check those paths instead of pyproject's ``files``."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "mypy" in lines
    assert [line for line in lines if line.startswith("mypy ")] == []
