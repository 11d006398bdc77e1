"""The CPU's floating-point code paths are part of a run's environment.

numpy's loops and the BLAS choose their vector width by the CPU, and a sum computed
eight lanes at a time has other low bits than one computed four at a time: a trace
recorded on a CPU with AVX-512 diverged when replayed on one with AVX2 only, and the
other way round, with nothing said but ``DIVERGED``.  Every process the CLI starts now
uses the AVX2/FMA paths unless the user chose others, the run records the paths it had,
and a replay on other paths says so in one line, naming the variables that reproduce
the run's.  Values read from a trace are only shown, never put into the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tracer
from replay import _environment as env
from tests import cli as tcli
from tests.conftest import MPI_TIMEOUT, ROOT

OTHER_FLAGS = ["sse", "sse2", "avx512f", "avx512bw", "aes", "sha_ni"]


@given(
    flags=st.sets(st.sampled_from(sorted(env.X86_V3_FLAGS) + OTHER_FLAGS)),
    numpy=st.sampled_from(["2.4.6", "2.5.0", "3.0.1", "2.3.5", "1.26.4", "2", "dev", ""]),
    prefix=st.sampled_from(["", "processor\t: 0\nvendor_id\t: X\n"]),
)
def test_only_a_cpu_with_every_avx2_flag_is_pinned(
    flags: set[str], numpy: str, prefix: str
) -> None:
    cpuinfo = f"{prefix}flags\t\t: {' '.join(sorted(flags))}\nbugs\t\t: none\n"
    got = env.portable_float(cpuinfo, numpy)
    if not env.X86_V3_FLAGS <= flags:
        assert got == {}  # OpenBLAS forced to Haswell would die of an illegal instruction
        return
    assert got["OPENBLAS_CORETYPE"] == "Haswell" and got["MKL_CBWR"] == "AVX2"
    known = numpy.split(".")[:2]
    new = len(known) == 2 and all(p.isdigit() for p in known) and tuple(map(int, known)) >= (2, 4)
    assert got.get("NPY_ENABLE_CPU_FEATURES") == ("X86_V3" if new else None)


@pytest.mark.parametrize("cpuinfo", ["", "flags:", "garbage\n\x00\xff", "flags avx2 fma"])
def test_no_flags_no_pins(cpuinfo: str) -> None:
    assert env.portable_float(cpuinfo, "2.4.6") == {}


def test_a_users_choice_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in env.FLOAT_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    monkeypatch.setenv("NPY_DISABLE_CPU_FEATURES", "X86_V4")
    got = env.float_env()
    assert got["OPENBLAS_CORETYPE"] == "Zen" and got["NPY_DISABLE_CPU_FEATURES"] == "X86_V4"
    assert "NPY_ENABLE_CPU_FEATURES" not in got  # numpy will not load with both set


def test_the_same_paths_say_nothing() -> None:
    here = env.float_paths()
    assert env.float_change(here) is None
    assert env.float_change({}) is None  # a trace from before the paths were recorded


@given(
    simd=st.one_of(
        st.none(),
        st.lists(st.sampled_from(["X86_V3", "X86_V4", "AVX512_ICL", "NEON"]), max_size=4),
        st.lists(st.text(max_size=40), max_size=40),
        st.integers(),
    ),
    core=st.one_of(st.none(), st.sampled_from(["Haswell", "SkylakeX", "Zen"]), st.text()),
)
def test_other_paths_are_one_line_and_never_a_hostile_hint(simd: object, core: object) -> None:
    here = env.float_paths()
    msg = env.float_change({"simd": simd, "blas_core": core})
    differs = (simd is not None and simd != here["simd"]) or (
        core is not None and here["blas_core"] is not None and core != here["blas_core"]
    )
    if here["simd"] is None:
        differs = core is not None and here["blas_core"] is not None and core != here["blas_core"]
    if not differs:
        assert msg is None
        return
    assert msg is not None and "\n" not in msg.replace("\\n", "")
    hint = msg.split("that has them, set ", 1)[1] if "that has them, set " in msg else ""
    for token in hint.split(" to match them,")[0].replace("'", " ").replace("=", " ").split():
        assert token.isidentifier(), (token, msg)  # only plain names are suggested


@pytest.fixture(scope="module")
def sandybridge_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run recorded by the console script with the user's ``OPENBLAS_CORETYPE`` set
    to another kernel family than the default, and no other float variable set."""
    if not env.portable_float():
        pytest.skip("this CPU has no AVX2/FMA paths to pin (or is not x86-64 Linux)")
    trace = tmp_path_factory.mktemp("float") / "t.sqlite"
    clean = {k: v for k, v in os.environ.items() if k not in env.FLOAT_VARS}
    cmd = ["run", "mlr", "-p", "synthetic=true", "-p", "epochs=1", "--trace", str(trace)]
    proc = subprocess.run(
        [sys.executable, "-m", "replay", *cmd, "--json"],
        env=dict(clean, PYTHONPATH=str(ROOT), OPENBLAS_CORETYPE="Sandybridge"),
        capture_output=True,
        text=True,
        timeout=MPI_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    return trace


def test_the_console_script_pins_what_the_user_left_unset(sandybridge_trace: Path) -> None:
    with tracer.open(sandybridge_trace) as store:
        recorded = store.run().info.environment
    assert recorded["OPENBLAS_CORETYPE"] == "Sandybridge" and recorded["blas_core"] == "Sandybridge"
    pinned = env.portable_float()
    if "NPY_ENABLE_CPU_FEATURES" in pinned:
        assert recorded["NPY_ENABLE_CPU_FEATURES"] == "X86_V3" and recorded["simd"] == ["X86_V3"]
    show = tcli.invoke(["show", str(sandybridge_trace)])
    assert "OpenBLAS Sandybridge" in show.stdout, show.stdout


def test_a_replay_on_other_paths_says_which_and_how_to_match(sandybridge_trace: Path) -> None:
    """Here (this suite's kernels: Haswell) the replay diverges and names the variable;
    with it set, the same replay is identical and says nothing."""
    with pytest.warns(env.ReplayEnvironmentWarning, match="other CPU code paths") as got:
        other = tcli.invoke(["single", str(sandybridge_trace), "--json"])
    warned = [str(w.message) for w in got if "other CPU code paths" in str(w.message)]
    assert len(warned) == 1 and "OPENBLAS_CORETYPE=Sandybridge" in warned[0], warned
    assert other.returncode == 3 and json.loads(other.stdout)["identical"] is False
    from tests.conftest import run_cli

    proc = run_cli(
        ["single", str(sandybridge_trace), "--json"], env={"OPENBLAS_CORETYPE": "Sandybridge"}
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["identical"], proc.stderr
    assert "other CPU code paths" not in proc.stderr


@pytest.mark.mpi
def test_ranks_on_different_paths_are_refused_before_running(tmp_path: Path) -> None:
    """Two hosts with different CPUs (emulated: one rank told to use other OpenBLAS
    kernels) would each sum in their own way: one line naming each rank's paths, every
    time (the ranks used to abort, and mpiexec then sometimes dropped what they wrote:
    status 2 and not a word in 3 runs of 8)."""
    if not env.portable_float():
        pytest.skip("this CPU has no AVX2/FMA paths to pin (or is not x86-64 Linux)")
    from tests.conftest import mpiexec

    run = [sys.executable, "-m", "replay", "run", "mlr", "-p", "synthetic=true", "--no-trace"]
    cmd = [mpiexec(), "-n", "1", "-env", "OPENBLAS_CORETYPE", "Sandybridge", *run]
    proc = subprocess.run(
        [*cmd, ":", "-n", "1", *run],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=MPI_TIMEOUT,
    )
    said = [ln for ln in proc.stderr.splitlines() if "different CPU code paths" in ln]
    assert proc.returncode == 2 and len(said) == 1, (proc.returncode, proc.stderr)
    assert "OpenBLAS Sandybridge" in said[0] and "OpenBLAS Haswell" in said[0], said
    assert "Traceback" not in proc.stderr


def test_a_run_recorded_on_other_paths_is_not_resumed_here(tmp_path: Path) -> None:
    """A resume promises the uninterrupted run's bits: on other float paths it would
    finish with another result and exit 0 (a warning is not enough), so it is refused
    in one line naming the variable, and resumes once that is set."""
    if not env.portable_float():
        pytest.skip("this CPU has no AVX2/FMA paths to pin (or is not x86-64 Linux)")
    from tests.conftest import run_cli
    from tests.replay.test_resume import target

    trace = tmp_path / "t.sqlite"
    args = ["run", target("mlr"), "-p", "epochs=4", "--trace", str(trace)]
    args += ["--checkpoint-every", "1", "--timeout", "60"]
    kill = {"RESUME_KILL": "0:2:1", "RESUME_HOW": "interrupt", "OPENBLAS_CORETYPE": "Sandybridge"}
    assert run_cli(args, env=kill).returncode != 0
    refused = tcli.invoke(["resume", str(trace)])
    said = [ln for ln in refused.stderr.splitlines() if ln.strip()]
    assert refused.returncode == 2 and len(said) == 1, refused.stderr
    assert "cannot be resumed here" in said[0] and "OPENBLAS_CORETYPE=Sandybridge" in said[0]
    proc = run_cli(["resume", str(trace), "--json"], env={"OPENBLAS_CORETYPE": "Sandybridge"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["continues"]


def test_the_numpy_version_is_read_without_loading_numpy() -> None:
    """Every command pins before numpy loads, so it reads the version from the files
    (the package metadata alone took ~20 ms a command)."""
    from importlib.metadata import version

    assert env._numpy_version() == version("numpy")
    code = "import sys; from replay import _environment as e; e.pin_float(); "
    code += "print('numpy' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=MPI_TIMEOUT,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


def test_a_setting_that_stops_numpy_is_one_line(tmp_path: Path) -> None:
    """numpy refuses to load with both variables set (or with a target this CPU lacks)
    and raised its traceback from the middle of the CLI's imports."""
    from tests.conftest import run_cli

    both = {"NPY_ENABLE_CPU_FEATURES": "X86_V3", "NPY_DISABLE_CPU_FEATURES": "X86_V4"}
    proc = run_cli(["ls", str(tmp_path)], env=both)
    said = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(said) == 1, proc.stderr
    assert said[0].startswith("replay: error: numpy cannot load: Both NPY_DISABLE")
    assert "NPY_DISABLE_CPU_FEATURES='X86_V4'" in said[0]


@given(
    simd=st.one_of(st.none(), st.integers(), st.lists(st.text(max_size=200), max_size=50)),
    core=st.one_of(st.none(), st.integers(), st.text(max_size=500)),
)
def test_paths_read_from_a_trace_are_shown_cut_short(simd: object, core: object) -> None:
    """``replay show`` prints a trace's paths: whatever they hold, a bounded text."""
    text = env.paths_text({"simd": simd, "blas_core": core}, None)
    assert len(text) <= len("SIMD , OpenBLAS ") + 60 + 30
    assert ("SIMD" in text) is isinstance(simd, list)
    assert ("OpenBLAS" in text) is (core is not None)
    assert env.paths_text({}) == "SIMD ?, OpenBLAS ?"
