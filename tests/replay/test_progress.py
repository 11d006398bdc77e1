"""Progress bars: shown on a terminal, absent from output that scripts read."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay._progress import TICK, parse_tick, tick_line
from tests import cli as tcli
from tests.conftest import MPI_TIMEOUT, ROOT, run_cli

SMALL = ["-p", "synthetic=true", "-p", "epochs=3", "-p", "rank=4"]


@given(
    st.integers(0, 10**9),
    st.one_of(st.none(), st.integers(0, 10**9)),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
)
def test_tick_lines_round_trip(done: int, total: int | None, what: str) -> None:
    assert parse_tick(tick_line(done, total, what)) == (done, total, what)


@pytest.mark.parametrize("line", ["", "replaying run", TICK, TICK + "x 3 inv", TICK + "1"])
def test_other_lines_are_not_ticks(line: str) -> None:
    assert parse_tick(line) is None


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("progress") / "t.sqlite"
    run = ["run", "sgdmf", *SMALL, "--ranks", "2", "--trace", str(path), "--checkpoint-every", "1"]
    proc = tcli.invoke(run)  # in this process (its ranks are mpiexec's): no terminal here
    assert proc.returncode == 0, proc.stderr
    return path


def _with_terminal_stderr(args: list[str]) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal; (status, stdout, terminal output)."""
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm", COLUMNS="100")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "replay", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out, _ = proc.communicate(timeout=MPI_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"replay {' '.join(args)} timed out")
    reader.join(timeout=10)
    os.close(master)
    return proc.returncode, out, b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("mode,label", [("cluster", "cluster replay"), ("single", "single replay")])
def test_a_terminal_gets_a_bar_of_invocations(trace: Path, mode: str, label: str) -> None:
    status, out, term = _with_terminal_stderr([mode, str(trace)])
    assert status == 0, (out, term)
    assert f"{label}: invocations" in term and "3/3" in term, term
    assert TICK not in out and TICK not in term


@pytest.mark.parametrize("mode", ["cluster", "single"])
def test_no_bar_without_a_terminal_or_with_json(trace: Path, mode: str) -> None:
    for extra in ([], ["--json"]):
        proc = run_cli([mode, str(trace), *extra])
        assert proc.returncode == 0, proc.stderr
        for text in (proc.stdout, proc.stderr):
            assert TICK not in text and "invocations ━" not in text
    status, out, term = _with_terminal_stderr([mode, str(trace), "--json"])
    assert status == 0 and "invocations" not in term and TICK not in out, term


def test_history_shows_its_fast_forward_then_a_bar_on_a_terminal_and_nothing_piped(
    trace: Path,
) -> None:
    args = ["history", str(trace), "W[3]", "--between", "sgd:1", "sgd:2"]
    status, out, term = _with_terminal_stderr(args)
    assert status == 0, (out, term)
    assert "history: fast-forward to the checkpoint after sgd#0" in term, term
    assert "history: invocations" in term and "2/2" in term, term
    assert TICK not in out and TICK not in term and "sgd#2" in out
    proc = run_cli(args)  # a pipe: under 10 s, no progress line at all
    assert proc.returncode == 0 and "sgd#2" in proc.stdout, proc.stderr
    assert TICK not in proc.stderr and "invocations" not in proc.stderr, proc.stderr


def test_dual_shows_each_side_and_the_mpi_ranks_report_through_mpiexec() -> None:
    args = ["dual", "sgdmf", *SMALL, "--ranks", "2", "--no-trace"]
    status, out, term = _with_terminal_stderr(args)
    assert status == 0, (out, term)
    for stage in ("forward: serial run", "forward: parallel run", "backward: parallel run"):
        assert f"dual test: {stage}" in term, term
    assert "3/3" in term and TICK not in out and TICK not in term
    assert "forward: PASS" in out and "backward: PASS" in out


def _terminal() -> tuple[object, object]:
    import io

    from rich.console import Console

    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=120, color_system=None), buf


def test_a_known_total_shows_count_rate_and_time_left() -> None:
    from replay._progress import Printer

    now = [100.0]
    console, buf = _terminal()
    with Printer(False, "cluster replay", console=console, clock=lambda: now[0]) as say:
        for k in range(1, 5):  # one invocation a second
            now[0] += 1.0
            say(tick_line(k, 10, "invocations"))
        say._progress.refresh()
    out = buf.getvalue()
    assert "cluster replay: invocations" in out and "4/10" in out, out
    assert "1.00/s" in out and "ETA 0:00:06" in out, out


def test_an_unknown_total_says_so_until_the_next_stage_starts_then_stands_full() -> None:
    from replay._progress import Printer

    now = [0.0]
    console, buf = _terminal()
    with Printer(False, "dual test", console=console, clock=lambda: now[0]) as say:
        for k in (1, 2, 3):
            now[0] += 2.0
            say(tick_line(k, None, "forward: serial run"))
        say._progress.refresh()
        assert "3/?" in buf.getvalue() and "None" not in buf.getvalue()
        now[0] += 1.0
        say(tick_line(1, 5, "forward: parallel run"))
        first, second = say._progress.tasks
        assert first.stop_time is not None and second.stop_time is None
        # the serial side is over: it reached 3 of 3, and says so without a "?"
        assert first.finished and first.total == 3 and first.fields["count"] == "3"
        cells = [str(c.render(first)) for c in say._progress.columns[3:]]
        assert cells == ["0:00:05", "0.50/s", ""], cells  # from its first tick; rate; no ETA


def test_a_result_erases_the_bar_first_even_from_another_thread() -> None:
    """The bar is fed by the threads that read the MPI ranks' output; the result line the
    command prints afterwards must start on a clean line, not after the bar's last frame."""
    from replay._cliutil import printer
    from replay._progress import _LIVE, Printer

    console, buf = _terminal()
    with Printer(False, "cluster replay", console=console) as say:
        feeder = threading.Thread(target=say, args=(tick_line(3, 3, "invocations"),))
        feeder.start()
        feeder.join()
        assert say._progress is not None and _LIVE == [say]
        before = len(buf.getvalue())
        printer(False)("identical: 3 digest(s)")
        assert say._progress is None and _LIVE == []
        assert "\x1b[2K" in buf.getvalue()[before:]  # the bar's line was erased


def test_a_phase_is_a_named_spinner_until_the_next_line_and_never_text() -> None:
    from replay._progress import Printer, phase_line

    console, buf = _terminal()
    with Printer(False, "run", console=console) as say:
        say(phase_line("planning sgd"))
        say._progress.refresh()
        (task,) = say._progress.tasks
        assert task.description == "run: planning sgd" and task.total is None
        say("plan sgd: rotation, 2 round(s)")  # the phase is over
        assert say._progress.tasks == []
        say(phase_line("compiling kernel sgd"))
        say(tick_line(1, 4, "invocations"))  # so is this one
        assert [t.description for t in say._progress.tasks] == ["run: invocations"]
    assert "run: planning sgd" in buf.getvalue() and TICK not in buf.getvalue()


def test_off_a_terminal_a_phase_is_a_plain_line_now_and_then(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from replay._cliutil import printer
    from replay._progress import PLAIN_EVERY_ENV, Printer, phase_line

    monkeypatch.setenv(PLAIN_EVERY_ENV, "10")
    now = [0.0]
    say = Printer(False, "run", clock=lambda: now[0])
    say(phase_line("planning sgd"))  # too soon after the start: nothing
    now[0] = 12.0
    say(phase_line("checkpoint after sgd#0"))
    printer(False)(phase_line("planning sgd"))  # a plain printer drops protocol lines
    out, err = capsys.readouterr()
    assert out == "" and err == "replay: run: checkpoint after sgd#0 (at 12 s)\n"


def test_the_engine_names_planning_a_kernel_compile_and_counts_checkpoints_on_one_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine as ap
    from replay._job import run_here
    from replay._progress import Printer, parse_phase

    def prog() -> None:
        X = ap.dvector(8, shape=(), init=ap.init.zeros(), name="X")

        def body(j: int) -> None:
            X[j] = X[j] + 1.0

        ap.async_for(0, 8, body, name="add")

    phases: list[str] = []
    ap.run(prog, nodes=2, phases=phases.append)
    assert phases == ["planning add"], phases
    from apps.sgdmf._app import sgd_kernel

    # as in a fresh process: an earlier test in this one may have compiled the kernel
    monkeypatch.setattr(sgd_kernel, "_bodies", {})
    console, buf = _terminal()
    shown: list[list[str]] = []
    lines: list[str] = []
    spec = {"app": "sgdmf", "params": ["synthetic=true", "epochs=2", "kernel=true"]}
    spec.update(threads=1, seed=0, trace=str(tmp_path / "t.sqlite"), checkpoint_every=1)
    with Printer(False, "run", console=console) as say:

        def spy(line: str) -> None:
            lines.append(line)
            say(line)
            if say._progress is not None:
                shown.append([t.description for t in say._progress.tasks])

        run_here(spec, progress=spy)
        (last,) = (t for t in say._progress.tasks if t.description == "run: checkpoints")
        assert last.fields["count"] == "2" and last.finished, last
    named = [p for p in map(parse_phase, lines) if p is not None]
    assert "planning sgd" in named and "compiling kernel sgd_kernel" in named, named
    assert ["run: planning sgd"] in shown and ["run: compiling kernel sgd_kernel"] in shown
    # two checkpoints, one bar: never a spinner per checkpoint, never two bars of them
    assert all(d.count("run: checkpoints") <= 1 for d in shown), shown
    assert not any("checkpoint after" in d for tasks in shown for d in tasks), shown
    screen = buf.getvalue()
    assert "run: checkpoints" in screen and "run: checkpoint after" not in screen, screen
    # a replay from a checkpoint names its fast-forward, then replays identically
    from replay._replay import replay_here

    lines.clear()
    rep = {"kind": "replay", "mode": "single", "trace": spec["trace"], "from": ["sgd", 1]}
    res = replay_here(rep, progress=lines.append)
    assert res["identical"], res
    named = [p for p in map(parse_phase, lines) if p is not None]
    assert named[0] == "fast-forward to the checkpoint after sgd#0", named


def test_checkpoints_share_one_bar_that_pulses_while_writing_and_then_stands_full() -> None:
    """A run that checkpoints after every invocation shows one checkpoints bar, below the
    invocations, whose clock counts only the time spent writing them; it is erased with
    the other bars before the result."""
    from replay._progress import Printer, phase_line

    now = [0.0]
    console, buf = _terminal()
    with Printer(False, "dual test", console=console, clock=lambda: now[0]) as say:
        for k in range(5):
            say(tick_line(k + 1, 5, "forward: parallel run"))
            say(phase_line(f"checkpoint after sgd#{k}"))
            writing = say._progress.tasks
            assert [t.description for t in writing] == [
                "dual test: forward: parallel run",
                "dual test: checkpoints",
            ]
            assert writing[1].total is None  # pulsing: a checkpoint is being written
            now[0] += 2.0  # writing it
            say(f"iter {k:>3}  rmse = 0.9")  # the checkpoint is written
            now[0] += 10.0  # the next invocation
            done = say._progress.tasks[1]
            assert done.total == done.completed == k + 1 and done.finished
        say(tick_line(1, None, "backward: serial run"))  # a later stage goes above it
        say._progress.refresh()
        descriptions = [t.description for t in say._progress.tasks]
        assert descriptions[-1] == "dual test: checkpoints", descriptions
        (bar,) = [line for line in buf.getvalue().splitlines() if "checkpoints" in line][-1:]
        assert " 5 " in bar and "0:00:10" in bar, bar  # 5 written, 5 x 2 s
        assert "/s" not in bar  # checkpoints per second of the run would mean nothing
    assert say._progress is None and "checkpoint after" not in buf.getvalue()


def _counting_program(invocations: int) -> object:
    import engine as ap

    def prog() -> None:
        X = ap.dvector(8, shape=(), init=ap.init.zeros(), name="X")

        def body(j: int) -> None:
            X[j] = X[j] + 1.0

        for _ in range(invocations):
            ap.async_for(0, 8, body, name="add")

    return prog


def test_digests_are_named_only_when_they_take_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """Digests that take microseconds must not flash a spinner per invocation; large or
    slow ones are a phase like planning."""
    import engine as ap
    from engine._runtime import session

    phases: list[str] = []
    ap.run(_counting_program(3), nodes=2, phases=phases.append)
    assert phases == ["planning add"], phases
    monkeypatch.setattr(session, "DIGEST_PHASE_BYTES", 64)  # X holds 64 bytes
    phases.clear()
    ap.run(_counting_program(3), nodes=2, phases=phases.append)
    want = [f"digests after add#{k}" for k in range(3)]
    assert phases == ["planning add", *want], phases
    monkeypatch.setattr(session, "DIGEST_PHASE_BYTES", 2**40)
    monkeypatch.setattr(session, "DIGEST_PHASE_S", 0.0)  # the last ones were slow
    phases.clear()
    ap.run(_counting_program(3), nodes=2, phases=phases.append)
    assert phases == ["planning add", *want[1:]], phases


def test_a_sync_for_names_its_reconnaissance_once() -> None:
    import numpy as np

    import engine as ap

    def prog() -> None:
        D = ap.dvector(8, shape=(1,), data=np.arange(8.0).reshape(8, 1), name="D")
        X = ap.dvector(2, shape=(1,), name="X")

        def body(batch: object) -> None:
            X[0] += batch.values.sum()  # type: ignore[attr-defined]

        for _ in range(3):
            ap.sync_for(D, 2, body, name="sum")

    phases: list[str] = []
    ap.run(prog, nodes=2, phases=phases.append)
    assert phases == ["reconnaissance sum"], phases


def test_digest_phases_are_a_spinner_on_a_terminal_and_no_flood_on_a_pipe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import engine as ap
    from engine._runtime import session
    from replay._progress import PLAIN_EVERY_ENV, Printer, phases_to

    monkeypatch.setattr(session, "DIGEST_PHASE_BYTES", 0)  # every invocation announces
    console, buf = _terminal()
    shown: list[list[str]] = []
    with Printer(False, "run", console=console) as say:

        def spy(line: str) -> None:
            say(line)
            say._progress.refresh()
            shown.append([t.description for t in say._progress.tasks])

        ap.run(_counting_program(3), nodes=2, phases=phases_to(spy))
    assert ["run: digests after add#2"] in shown, shown
    assert all(len(tasks) == 1 for tasks in shown)  # one spinner at a time, never a pile
    assert "run: digests after add#0" in buf.getvalue() and TICK not in buf.getvalue()
    monkeypatch.setenv(PLAIN_EVERY_ENV, "10")
    capsys.readouterr()
    say = Printer(False, "run")  # stderr is not a terminal here: plain lines
    ap.run(_counting_program(40), nodes=2, phases=phases_to(say))
    out, err = capsys.readouterr()
    assert out == "" and err == "", err  # 41 phases in well under 10 s: not one line
