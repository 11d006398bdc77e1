"""Every test is in exactly one layer (unit, e2e, mpi; tests/conftest.py), and the fast
``unit`` layer is big enough to be worth running on its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import (
    LAYERS,
    ROOT,
    SLOW_TESTS,
    UNIT_SECONDS,
    collected_layers,
    no_processes,
)

#: The least the ``unit`` layer may hold: it is the layer run while editing, so a
#: classifier that pushed most of the suite out of it would quietly weaken that loop.
MIN_UNIT_TESTS = 500


@pytest.fixture(scope="module")
def layers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[str]]:
    """Each collected test's layer markers: this session's own if it collected the whole
    suite (a plain ``pytest``), else from a ``--collect-only`` run of the suite (which
    took ~16 s of CI's time when it ran there too)."""
    here = collected_layers(request.config)
    if here is not None:
        return here
    report = tmp_path_factory.mktemp("layers") / "layers.json"
    env = dict(os.environ, REPLAY_LAYERS_REPORT=str(report))
    proc = subprocess.run(
        # one process: the report is written where collection happens (not in workers)
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return dict(json.loads(Path(report).read_text()))


def test_every_test_is_in_exactly_one_layer(layers: dict[str, list[str]]) -> None:
    wrong = {test: marks for test, marks in layers.items() if sum(m in LAYERS for m in marks) != 1}
    assert not wrong, f"tests not in exactly one of {LAYERS}: {wrong}"
    assert __name__.replace(".", "/") + ".py::test_every_test_is_in_exactly_one_layer" in layers


def test_the_unit_layer_holds_enough_tests(layers: dict[str, list[str]]) -> None:
    unit = [test for test, marks in layers.items() if "unit" in marks]
    assert len(unit) >= MIN_UNIT_TESTS, f"only {len(unit)} unit tests of {len(layers)}"


def test_a_module_that_starts_processes_can_still_hold_unit_tests(
    layers: dict[str, list[str]],
) -> None:
    """Classification is per test: an in-process test beside ``run_cli`` ones stays unit."""
    here = "tests/test_layers.py::"
    assert layers[here + "test_every_test_is_in_exactly_one_layer"][0] == "e2e"
    assert layers[
        "tests/replay/test_dual_property.py::test_descriptions_reject_out_of_range_accesses"
    ] == ["unit"]


def test_the_measured_slow_tests_exist_and_leave_the_unit_layer(
    layers: dict[str, list[str]],
) -> None:
    """tests/durations.json names collected tests only (a renamed test would silently
    return to the fast layer), and each of them is ``slow`` and not ``unit``."""
    doc = json.loads(SLOW_TESTS.read_text())
    assert doc["unit_seconds"] == UNIT_SECONDS
    slow = doc["slow"]
    assert slow and all(seconds > UNIT_SECONDS for seconds in slow.values())
    gone = [test for test in slow if test not in layers]
    assert not gone, f"tests/durations.json names tests that no longer exist: {gone}"
    wrong = {test: layers[test] for test in slow if "unit" in layers[test]}
    assert not wrong and all("slow" in layers[test] for test in slow), wrong


def test_a_unit_test_that_starts_a_process_fails_even_if_it_catches_the_error() -> None:
    with pytest.raises(pytest.fail.Exception, match="started a process.*true"):
        with no_processes():
            with pytest.raises(OSError, match="may not start a process"):
                subprocess.run(["true"], check=False)
    assert subprocess.run(["true"], check=False).returncode == 0  # restored
    with no_processes():
        pass  # nothing started: nothing fails
