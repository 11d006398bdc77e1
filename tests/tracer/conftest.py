"""Fixtures of the tracer tests: small real traces recorded from engine runs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from tracehelp import record  # noqa: E402


@pytest.fixture(scope="session")
def recorded_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace of a 2-node, 3-thread toy run (read-only: copy it before damaging it)."""
    path = tmp_path_factory.mktemp("recorded") / "toy.sqlite"
    record(path)
    return path


@pytest.fixture
def trace_copy(recorded_trace: Path, tmp_path: Path) -> Path:
    """A private copy of ``recorded_trace``."""
    dst = tmp_path / "copy.sqlite"
    shutil.copyfile(recorded_trace, dst)
    return dst
