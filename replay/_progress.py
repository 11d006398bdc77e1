"""Progress on long work: a rich bar on a terminal, a plain line now and then elsewhere.

Work that runs here or in MPI ranks reports through the same line-based ``progress``
callback the CLI already gives it: an ordinary line is text for the user, and a line
made by :func:`tick_line` says how far the work is ("3 of 20 invocations").  The ranks'
lines reach the CLI through mpiexec's stdout, so one format serves both cases.  The
:class:`Printer` the CLI hands out turns tick lines into a bar when stderr is a
terminal and ``--json`` is off; off a terminal (a pipe, a CI log) it prints one plain
line on stderr at most every :data:`PLAIN_EVERY_S` seconds (``replay: cluster replay
5/10 invocations, 28 s``), so long work shows life and short work prints nothing; under
``--json`` it prints none.  stdout stays exactly what it was.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import click

#: Environment variable that lets a data set download show pip's bar (read by
#: ``apps._datasets.show_progress``; the CLI sets it when a person watches).
DOWNLOAD_PROGRESS_ENV = "STRADS_REPLAY_PROGRESS"
#: Environment variable that, set to ``1``, makes a ``--json`` command print its progress
#: as protocol lines on stderr (for a program that shows them itself: the browser runs
#: ``replay history --json`` in a child and draws its bar); nobody else sets it.
TICKS_ENV = "STRADS_REPLAY_TICKS"
#: Prefix of a line that reports progress rather than text (never shown as text).
TICK = "\x1breplay-progress "
#: Off a terminal, the least seconds between two plain progress lines (and before the first).
PLAIN_EVERY_S = 10.0
#: Environment variable that sets those seconds (0: no plain lines at all).
PLAIN_EVERY_ENV = "STRADS_REPLAY_PROGRESS_EVERY"


#: Set by ``--quiet`` for the command that runs: no bars, spinners or plain progress lines.
_QUIET: ContextVar[bool] = ContextVar("replay_progress_quiet", default=False)


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """Printers made inside this block show no progress at all (``--quiet``)."""
    token = _QUIET.set(on)
    try:
        yield
    finally:
        _QUIET.reset(token)


def is_quiet() -> bool:
    """Whether progress is off for the running command (``--quiet``)."""
    return _QUIET.get()


def plain_every() -> float | None:
    """Seconds between plain progress lines (None: none), from :data:`PLAIN_EVERY_ENV`."""
    raw = os.environ.get(PLAIN_EVERY_ENV, "").strip()
    try:
        every = float(raw) if raw else PLAIN_EVERY_S
    except ValueError:
        every = PLAIN_EVERY_S  # a malformed value must not stop the work it reports on
    return every if every > 0 else None


def tick_line(done: int, total: int | None, what: str) -> str:
    """The line that says ``done`` of ``total`` (None: unknown) units of ``what`` are done."""
    return f"{TICK}{done} {-1 if total is None else total} {what}"


#: Prefix of a line that says a long phase started (``planning sgd``).
PHASE = TICK + "phase "


def phase_line(name: str) -> str:
    """The line that says the long phase ``name`` started (it lasts until the next tick)."""
    return PHASE + name


#: Prefix of the phase the engine announces before each checkpoint it writes; a
#: :class:`Printer` counts them on one bar instead of showing a spinner for each.
CHECKPOINT_PHASE = "checkpoint after "


def parse_phase(line: str) -> str | None:
    """The phase a :func:`phase_line` names; None for any other line."""
    return line[len(PHASE) :] if line.startswith(PHASE) else None


def phases_to(say: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """``engine.run(phases=...)`` that sends phase lines to ``say`` (None: no phases)."""
    if say is None:
        return None
    out = say
    return lambda name: out(phase_line(name))


def phase_reporter(say: Callable[[str], None] | None = None) -> Callable[[str], None] | None:
    """``engine.run(phases=...)``: phase lines to ``say``, else to the stage current now
    (:func:`reporting`); None when nobody listens."""
    if say is None:
        cur = current_stage()
        say = None if cur is None else cur.say
    return phases_to(say)


def parse_tick(line: str) -> tuple[int, int | None, str] | None:
    """``(done, total, what)`` of a tick line; None for an ordinary or garbled line."""
    if not line.startswith(TICK):
        return None
    parts = line[len(TICK) :].split(" ", 2)
    try:
        done, total = int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None
    return done, (None if total < 0 else total), parts[2] if len(parts) > 2 else ""


def route_ticks(ticks: Callable[[str], None], text: Callable[[str], None]) -> Callable[[str], None]:
    """A line callback that sends tick and phase lines (anything with the protocol's
    prefix, never text for a person) to ``ticks`` and the others to ``text``."""

    def out(line: str) -> None:
        (ticks if line.startswith(TICK) else text)(line)

    return out


def _tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def bars_wanted(as_json: bool) -> bool:
    """Bars only for a person: stderr is a terminal, no ``--json``, not a dumb terminal."""
    if as_json or os.environ.get("TERM") == "dumb":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def finish_bars() -> None:
    """Erase the bars on screen, if any: called before a result is printed, so the result
    starts on its own line instead of after the bar's last frame."""
    for live in list(_LIVE):
        live.close()


class Printer:
    """The CLI's ``say``: prints text lines (on stderr under ``--json``) and shows tick
    lines as a bar labelled ``label`` (a context manager: the bar ends with the block)."""

    def __init__(
        self,
        as_json: bool,
        label: str = "working",
        *,
        bars: bool = True,
        clock: Callable[[], float] = time.monotonic,
        console: Any = None,
    ) -> None:
        self.as_json = as_json
        #: where bars go (a rich Console; None: stderr, made when the first bar is)
        self._console = console
        self.label = label
        shown = bars and not _QUIET.get()  # --quiet: no progress of any kind
        self._bars = shown and (console is not None or bars_wanted(as_json))
        # off a terminal (and not for a pdb session, which asks for no bars): plain lines
        self._every = plain_every() if shown and not as_json and not self._bars else None
        self._clock = clock
        self._start = self._last = clock()
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}
        self._phase_task: Any = None
        #: the one bar of the checkpoints (None: none yet), how many were written, their
        #: seconds so far and when the one being written started (None: none is)
        self._ckpt_task: Any = None
        self._ckpts = 0
        self._ckpt_spent = 0.0
        self._ckpt_since: float | None = None
        #: ``--json`` for a program that reads the protocol lines (:data:`TICKS_ENV`)
        self._raw = as_json and bars and os.environ.get(TICKS_ENV) == "1"

    def __call__(self, line: str) -> None:
        if self._raw and line.startswith(TICK):
            click.echo(line, err=True)
            return
        phase = parse_phase(line)
        if phase is not None:
            self._phase(phase)
            return
        tick = parse_tick(line)
        if self._progress is not None:
            self._end_phase()  # a tick or a line of text: the phase is over
        if tick is None and self._progress is not None and _tty(sys.stdout):
            # stdout and the bar share the screen: print above the bar, never after its frame
            from rich.text import Text

            self._progress.console.print(Text(line), soft_wrap=True)
        elif tick is None:
            click.echo(line, err=self.as_json)
        elif self._bars:
            self._show(*tick)
        elif self._every is not None:
            self._say_plainly(self._every, *tick)

    def _phase(self, name: str) -> None:
        """A spinner (an indeterminate bar with its clock) named ``name`` until the next
        tick or phase; off a terminal, a plain line if none was printed for a while."""
        if self._bars and name.startswith(CHECKPOINT_PHASE):
            self._checkpoint()
        elif self._bars:
            self._show(0, None, "", phase=name)
        elif self._every is not None:
            now = self._clock()
            if now - self._last >= self._every:
                self._last = now
                # the time since the start, not the phase's length: "(at 12 s)", so that
                # "compiling kernel sgd, 12 s" is not read as a 12-second compile
                click.echo(f"replay: {self.label}: {name} (at {now - self._start:.0f} s)", err=True)

    def _end_phase(self) -> None:
        if self._phase_task is not None and self._progress is not None:
            self._progress.remove_task(self._phase_task)
        self._phase_task = None
        if self._ckpt_since is not None and self._progress is not None:
            # the checkpoint is written: its bar stands full, its clock stops
            self._ckpt_spent += self._clock() - self._ckpt_since
            self._ckpt_since = None
            n = self._ckpts
            self._progress.update(self._ckpt_task, total=n, completed=n, **self._ckpt_fields())

    def _checkpoint(self) -> None:
        """Checkpoints share one bar, last on screen, that counts them and pulses while
        one is written: a run that takes one per invocation must not flash a spinner per
        checkpoint (on a terminal; off it, they are phases like any other)."""
        self._open()
        self._end_phase()
        self._ckpts += 1
        self._ckpt_since = self._clock()
        self._readd_checkpoints()

    def _ckpt_fields(self) -> dict[str, Any]:
        # the count only: the column is shared with the other bars, and 80 columns are few
        return {"count": str(self._ckpts), "spent": self._ckpt_spent, "since": self._ckpt_since}

    def _readd_checkpoints(self) -> None:
        """(Re)place the checkpoints' bar below every other: pulsing while one is being
        written (total unknown), else full."""
        if self._ckpt_task is not None:
            self._progress.remove_task(self._ckpt_task)
        total = None if self._ckpt_since is not None else self._ckpts
        self._ckpt_task = self._progress.add_task(
            f"{self.label}: checkpoints", total=total, completed=self._ckpts, **self._ckpt_fields()
        )

    def _say_plainly(self, every: float, done: int, total: int | None, what: str) -> None:
        now = self._clock()
        if now - self._last < every:
            return
        self._last = now
        count = f"{done}/{total}" if total is not None else str(done)
        unit = f" {what}" if what else ""
        click.echo(f"replay: {self.label} {count}{unit}, {now - self._start:.0f} s", err=True)

    def _open(self) -> None:
        """Put the bars on screen (once)."""
        if self._progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[count]}"),
                *_time_columns(self._clock),
                console=self._console or Console(stderr=True),
                get_time=self._clock,
                transient=True,
                redirect_stdout=_tty(sys.stdout),  # else stdout goes to its file as is
                redirect_stderr=False,
            )
            self._progress.start()
            _LIVE.append(self)

    def _show(self, done: int, total: int | None, what: str, phase: str | None = None) -> None:
        self._open()
        self._end_phase()
        if phase is not None:
            self._phase_task = self._progress.add_task(
                f"{self.label}: {phase}", total=None, count=""
            )
            return
        key = what or self.label
        task = self._tasks.get(key)
        count = f"{done}/{'?' if total is None else total}"
        if task is None:
            # stages follow one another: the earlier ones are over, their clocks stop here
            for earlier in self._tasks.values():
                self._finish(earlier)
            task = self._tasks[key] = self._progress.add_task(
                f"{self.label}: {key}", total=total, count=count
            )
            if self._ckpt_task is not None:
                self._readd_checkpoints()  # the checkpoints' bar stays the last one
        self._progress.update(task, completed=done, total=total, count=count)

    def _finish(self, task_id: Any) -> None:
        """Stop a stage's clock; one whose total was unknown ("10/?") now has it: the
        count it reached, shown full ("10"), with the rate it ran at."""
        self._progress.stop_task(task_id)
        (task,) = (t for t in self._progress.tasks if t.id == task_id)
        if task.total is None and task.completed > 0:
            speed = task.finished_speed or task.speed
            done = int(task.completed)
            self._progress.update(task_id, total=done, count=str(done))
            task.finished_speed = speed  # the update forgot the samples it came from

    def close(self) -> None:
        """Erase the bars (they are transient); later ticks start new ones."""
        self._phase_task = self._ckpt_task = self._ckpt_since = None
        self._ckpts, self._ckpt_spent = 0, 0.0
        self._tasks.clear()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            if self in _LIVE:
                _LIVE.remove(self)

    def __enter__(self) -> Printer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _time_columns(clock: Callable[[], float]) -> list[Any]:
    """The time spent, units per second once some are done, and the time left where the
    total is known (both blank otherwise).  The checkpoints' bar (fields ``spent`` and
    ``since``) counts only the time spent writing checkpoints, and no rate.  rich is
    imported only when a bar is shown."""
    from datetime import timedelta

    from rich.progress import ProgressColumn
    from rich.text import Text

    class Elapsed(ProgressColumn):
        def render(self, task: Any) -> Text:
            if "spent" in task.fields:
                since = task.fields["since"]
                elapsed = task.fields["spent"] + (0.0 if since is None else clock() - since)
            else:
                elapsed = task.finished_time if task.finished else task.elapsed
            if elapsed is None:
                return Text("-:--:--", style="progress.elapsed")
            return Text(str(timedelta(seconds=max(0, int(elapsed)))), style="progress.elapsed")

    class Rate(ProgressColumn):
        def render(self, task: Any) -> Text:
            if "spent" in task.fields:
                return Text("")
            speed = task.finished_speed or task.speed
            return Text(f"{speed:.2f}/s" if speed else "", style="progress.data.speed")

    class Eta(ProgressColumn):
        def render(self, task: Any) -> Text:
            left = task.time_remaining
            if task.total is None or left is None or task.finished:
                return Text("")
            m, sec = divmod(int(left + 0.5), 60)
            return Text(f"ETA {m // 60}:{m % 60:02d}:{sec:02d}", style="progress.remaining")

    return [Elapsed(), Rate(), Eta()]


#: The Printers whose bars are on screen (shared by threads: the lines of MPI ranks reach a
#: Printer in the threads that read their output).
_LIVE: list[Printer] = []


# ====================================================================== stages of a run
@dataclass(frozen=True)
class Stage:
    """Where ticks of the current run go: ``say`` (a Printer or a rank's stdout), under
    the label ``what``, out of ``total`` invocations (None: not known in advance)."""

    say: Callable[[str], None]
    what: str = ""
    total: int | None = None


_STAGE: ContextVar[Stage | None] = ContextVar("replay_progress_stage", default=None)


def current_stage() -> Stage | None:
    """The stage set by :func:`reporting` / :func:`stage` (None: nobody listens)."""
    return _STAGE.get()


@contextlib.contextmanager
def reporting(
    say: Callable[[str], None] | None, what: str = "", total: int | None = None
) -> Iterator[None]:
    """Runs inside this block report their invocations to ``say`` (None: nowhere)."""
    token = _STAGE.set(None if say is None else Stage(say, what, total))
    try:
        yield
    finally:
        _STAGE.reset(token)


@contextlib.contextmanager
def stage(what: str, total: int | None = None) -> Iterator[None]:
    """Relabel the current stage (a no-op when nobody listens)."""
    cur = _STAGE.get()
    with reporting(None if cur is None else cur.say, what, total):
        yield


class InvocationTicker:
    """Counts the distinct (op, invocation) pairs a run completes and reports each new
    one to the stage current when it was made."""

    def __init__(self) -> None:
        self.stage = current_stage()
        self._seen: set[tuple[str, int]] = set()

    def done(self, op: str, invocation: int) -> None:
        if self.stage is None or (op, invocation) in self._seen:
            return
        self._seen.add((op, invocation))
        self.stage.say(tick_line(len(self._seen), self.stage.total, self.stage.what))


__all__ = [
    "CHECKPOINT_PHASE",
    "DOWNLOAD_PROGRESS_ENV",
    "PLAIN_EVERY_ENV",
    "PLAIN_EVERY_S",
    "TICK",
    "TICKS_ENV",
    "InvocationTicker",
    "PHASE",
    "Printer",
    "Stage",
    "bars_wanted",
    "current_stage",
    "finish_bars",
    "is_quiet",
    "parse_phase",
    "parse_tick",
    "phase_line",
    "phase_reporter",
    "phases_to",
    "plain_every",
    "quiet",
    "reporting",
    "route_ticks",
    "stage",
    "tick_line",
]
