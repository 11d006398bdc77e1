"""The real command in a real terminal: ``python -m tui TRACE`` inside tmux at 80×24."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TMUX = shutil.which("tmux")

pytestmark = pytest.mark.skipif(
    TMUX is None, reason="tmux is not installed (apt-get install tmux) so no real terminal"
)


class Pane:
    """A detached tmux server of our own running one command in an 80×24 window."""

    def __init__(self, command: str) -> None:
        self.socket = f"tui-test-{os.getpid()}-{time.monotonic_ns()}"
        self.tmux(
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            "80",
            "-y",
            "24",
            "-c",
            str(REPO),
            command,
        )
        # keep the pane after the program exits, so a crash can still be read
        self.tmux("set-option", "-t", "t", "remain-on-exit", "on")

    def tmux(self, *args: str) -> str:
        out = subprocess.run(
            [str(TMUX), "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        )
        return out.stdout

    def text(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def dead(self) -> bool:
        return self.tmux("display-message", "-p", "-t", "t", "#{pane_dead}").strip() == "1"

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def wait(self, ok: Callable[[str], bool], what: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if ok(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"tmux pane never showed {what}:\n{text}")
            time.sleep(0.1)

    def close(self) -> None:
        self.tmux("kill-server")


def test_browse_in_tmux(engine_trace: Path) -> None:
    env = f"PYTHONPATH={shlex.quote(str(REPO))} TERM=xterm-256color"
    pane = Pane(f"env {env} {shlex.quote(sys.executable)} -m tui {shlex.quote(str(engine_trace))}")
    try:
        text = pane.wait(lambda t: "Runs" in t and "2×3" in t, "the runs list")
        assert "hot" in text and "finished" in text and "1 trace file(s), 1 run(s)" in text
        assert len(text.splitlines()) <= 24 and max(map(len, text.splitlines())) <= 80
        pane.keys("Enter")
        text = pane.wait(lambda t: "operator" in t and "norm:" in t, "the run overview")
        assert "rotation" in text or "components" in text
        pane.keys("?")
        pane.wait(lambda t: "Keys: run overview" in t, "the help")
        pane.keys("Escape")
        pane.wait(lambda t: "Keys:" not in t, "the help closing")
        pane.keys("o")
        pane.wait(lambda t: "row(s)" in t and "lock" in t, "the orders view")
        pane.keys("q")
        pane.wait(lambda _: pane.dead(), "the app quitting", timeout=15)
        assert "Traceback" not in pane.text()
    finally:
        pane.close()
