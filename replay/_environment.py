"""The interpreter environment a run depends on: hash seed, BLAS threads, the CPU's
floating-point code paths, versions.

A deterministic program can still depend on its interpreter: the iteration order of
a ``set`` (or of a dict built from one) of strings follows ``PYTHONHASHSEED``, and a
multi-threaded BLAS may sum in another order.  So every run fixes both, records
them (with the Python, numpy and project versions) in the trace, and every replay
reuses them.  The CPU matters too: numpy's loops and the BLAS pick their vector width
by what the CPU offers, and a sum computed four or eight lanes at a time has other
low bits.  Every process the CLI starts therefore uses the AVX2/FMA paths
(:func:`portable_float`) unless the user chose others, and a run records the paths it
had, so that a trace recorded on a CPU with AVX-512 replays bit for bit on one without
and a replay whose paths differ says so.

A running interpreter cannot change its hash seed.  The ``replay`` CLI therefore
re-executes itself under the seed it needs (:func:`ensure`) wherever it would run the
program in its own process, and puts the seed into the environment of the ranks it
starts with ``mpiexec`` (:func:`worker_env`).  Library callers cannot be re-executed:
they get a :class:`ReplayEnvironmentWarning` instead (:func:`warn_replay_environment`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

HASH_SEED = "PYTHONHASHSEED"
#: Variables that pin BLAS/OpenMP pools to one thread (exact float sums, DESIGN §8).
BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: Variables that choose numpy's SIMD loops and the BLAS kernels (read when each loads).
FLOAT_VARS = (
    "NPY_ENABLE_CPU_FEATURES",
    "NPY_DISABLE_CPU_FEATURES",
    "OPENBLAS_CORETYPE",
    "MKL_CBWR",
)
#: CPU flags (Linux ``/proc/cpuinfo`` names) of x86-64-v3, the AVX2/FMA level numpy's
#: ``X86_V3`` and OpenBLAS's ``Haswell`` kernels need (``abm`` is LZCNT).
X86_V3_FLAGS = frozenset(
    {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave", "sse4_2"}
)
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
#: Set by a re-executing CLI to the hash seed it re-executed for: if the new process
#: still lacks that seed (``python -E`` ignores PYTHONHASHSEED), it warns instead of
#: re-executing forever.
REEXEC_MARKER = "STRADS_REPLAY_REEXEC_HASHSEED"
#: Hash seed of a run whose user did not set PYTHONHASHSEED.
DEFAULT_HASH_SEED = "0"
#: Versions whose change between a run and its replay is worth a warning.
VERSION_KEYS = ("python", "numpy", "strads-replay")
#: The key of ``engine.lowlevel.OBJECT_TEXT_VERSION`` in a run's versions.
OBJECT_TEXT = "object-text"

#: The command line to re-execute (set by the CLI's ``main``; None: no re-exec).
_reexec_args: list[str] | None = None


def _valid_seed(text: str | None) -> str | None:
    """``text`` as a canonical hash seed (0..4294967295), or None if it is not one."""
    if text is None or not text.strip().isdigit():
        return None
    n = int(text)
    return str(n) if n <= 4294967295 else None


def current_hash_seed() -> str | None:
    """This interpreter's hash seed, or None when it is randomized (unknown)."""
    if sys.flags.hash_randomization == 0:
        return "0"
    if sys.flags.ignore_environment:
        return None
    seed = _valid_seed(os.environ.get(HASH_SEED))
    return None if seed == "0" else seed  # "0" would have cleared hash_randomization


def choose_hash_seed() -> str:
    """The hash seed of a new run: the user's PYTHONHASHSEED if it is a number, else 0."""
    return _valid_seed(os.environ.get(HASH_SEED)) or DEFAULT_HASH_SEED


def recorded_hash_seed(environment: Mapping[str, Any]) -> str | None:
    """The hash seed a recorded run had (None: randomized, or not recorded)."""
    return _valid_seed(environment.get(HASH_SEED))


def worker_env(hash_seed: str | None) -> dict[str, str]:
    """Variables for processes that run a program: the hash seed, one BLAS thread and
    the floating-point paths (the user's, else :func:`portable_float`'s)."""
    env = dict.fromkeys(BLAS_VARS, "1")
    env[HASH_SEED] = hash_seed if hash_seed is not None else choose_hash_seed()
    env.update(float_env())
    return env


def portable_float(cpuinfo: str | None = None, numpy_version: str | None = None) -> dict[str, str]:
    """The variables that make numpy and the BLAS use their AVX2/FMA (x86-64-v3) code
    paths, which nearly every x86 CPU since 2015 has: empty where this CPU lacks them or
    is not an x86-64 Linux (nothing known to pin).  ``NPY_ENABLE_CPU_FEATURES`` is only
    set for numpy 2.4 and later, whose name for that level (``X86_V3``) is known.

    Read without importing numpy: the variables act only if set before it loads.
    ``cpuinfo`` and ``numpy_version`` replace ``/proc/cpuinfo`` and the installed
    numpy's version (tests)."""
    import platform

    if cpuinfo is None:
        if sys.platform != "linux" or platform.machine() != "x86_64":
            return {}
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                cpuinfo = f.read(1 << 16)  # the first CPU's flags come first
        except OSError:
            return {}
    flags = next(
        (
            ln.split(":", 1)[1].split()
            for ln in cpuinfo.splitlines()
            if ln.startswith("flags") and ":" in ln
        ),
        [],
    )
    if not X86_V3_FLAGS <= set(flags):
        return {}
    env = {"OPENBLAS_CORETYPE": "Haswell", "MKL_CBWR": "AVX2"}
    if numpy_version is None:
        numpy_version = _numpy_version()
        if numpy_version is None:
            return env
    parts = numpy_version.split(".")
    if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
        if (int(parts[0]), int(parts[1])) >= (2, 4):
            env["NPY_ENABLE_CPU_FEATURES"] = "X86_V3"
    return env


def _numpy_version() -> str | None:
    """The installed numpy's version without importing it: from the ``dist-info``
    directory beside the package (a listing, ~0.2 ms), else from the package metadata
    (~20 ms: every command pays it), else None."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("numpy")  # finds the package, runs none of it
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    site = os.path.dirname(next(iter(spec.submodule_search_locations)))
    with contextlib.suppress(OSError):
        for name in os.listdir(site):
            if name.startswith("numpy-") and name.endswith(".dist-info"):
                return name[len("numpy-") : -len(".dist-info")]
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("numpy")
    except PackageNotFoundError:
        return None


def float_env() -> dict[str, str]:
    """The floating-point variables a program's process gets: each the user's value if
    set (kept, and recorded), else :func:`portable_float`'s.  A user's
    ``NPY_DISABLE_CPU_FEATURES`` replaces the pinned ``NPY_ENABLE_CPU_FEATURES`` (numpy
    refuses to load with both)."""
    env = {var: os.environ[var] for var in FLOAT_VARS if var in os.environ}
    pinned = portable_float()
    if "NPY_DISABLE_CPU_FEATURES" in env:
        pinned.pop("NPY_ENABLE_CPU_FEATURES", None)
    return {**pinned, **env}


def pin_float() -> None:
    """Set :func:`float_env` in this process's environment: before numpy loads (the
    console script, first thing), it then takes those paths, and so do the processes
    it starts."""
    os.environ.update(float_env())


def float_paths(pools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The floating-point code paths this process has: numpy's SIMD targets in use
    (``simd``, the dispatched ones this CPU has and the environment left on) and the
    OpenBLAS kernel family (``blas_core``; None: unknown, threadpoolctl is missing).
    ``pools``: :func:`_blas_pools`, if the caller has them already."""
    simd: list[str] | None = None
    umath = _umath()
    if umath is not None:
        feats = getattr(umath, "__cpu_features__", {})
        simd = [f for f in getattr(umath, "__cpu_dispatch__", []) if feats.get(f)]
    blas = _blas_pools() if pools is None else pools
    cores = {str(p["architecture"]) for p in blas if p.get("architecture")}  # MKL: none
    return {"simd": simd, "blas_core": ",".join(sorted(cores)) or None}


def paths_text(paths: Mapping[str, Any], unknown: str | None = "?") -> str:
    """``SIMD X86_V3, OpenBLAS Haswell`` for a :func:`float_paths` record, this
    process's or one read from a trace (shown cut short, never trusted); a part not
    known reads ``unknown``, or is left out when that is None."""
    simd, core = paths.get("simd"), paths.get("blas_core")
    parts = []
    if isinstance(simd, list):
        parts.append(f"SIMD {' '.join(map(str, simd[:8]))[:60] or 'baseline'}")
    elif unknown is not None:
        parts.append(f"SIMD {unknown}")
    if core is not None:
        parts.append(f"OpenBLAS {str(core)[:30]}")
    elif unknown is not None:
        parts.append(f"OpenBLAS {unknown}")
    return ", ".join(parts)


def pin_blas() -> None:
    """Limit the BLAS pools of this process to one thread (the variables only act on
    libraries not loaded yet; threadpoolctl, if installed, limits loaded ones)."""
    os.environ.update(dict.fromkeys(BLAS_VARS, "1"))
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(1, user_api="blas")


def _blas_pools() -> list[dict[str, Any]]:
    """threadpoolctl's description of each loaded BLAS pool (none without it)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [p for p in threadpool_info() if p.get("user_api") == "blas"]


def blas_threads(pools: list[dict[str, Any]] | None = None) -> int | None:
    """Most threads of any loaded BLAS pool (None: none found, or threadpoolctl is not
    installed); ``pools``: :func:`_blas_pools`, if the caller has them already."""
    threads = [p["num_threads"] for p in (_blas_pools() if pools is None else pools)]
    return max(threads) if threads else None


def record() -> dict[str, Any]:
    """The environment record of a run started in this process (stored in the trace)."""
    env: dict[str, Any] = {HASH_SEED: current_hash_seed() or "random"}
    for var in BLAS_VARS:
        env[var] = os.environ.get(var)
    pools = _blas_pools()  # one look at the loaded libraries for both
    env["blas_threads"] = blas_threads(pools)
    for var in FLOAT_VARS:
        env[var] = os.environ.get(var)
    env.update(float_paths(pools))
    return env


# ------------------------------------------------------------------ the CLI re-exec
def allow_reexec(args: list[str]) -> None:
    """Let :func:`ensure` re-execute this process as ``replay ARGS`` (the CLI's entry)."""
    global _reexec_args
    _reexec_args = list(args)


def ensure(hash_seed: str | None) -> None:
    """Run the rest of this process under ``hash_seed`` with BLAS pinned to one thread.

    Re-executes the CLI with the same arguments when the seed differs (before MPI is
    initialised: mpiexec's ranks can do it too); where it cannot, warns instead.
    ``hash_seed`` None (an old trace, or a run recorded with a random seed) keeps
    this interpreter's seed.
    """
    if hash_seed is not None and current_hash_seed() != hash_seed:
        if _reexec_args is not None:
            reexec_for(hash_seed, _reexec_args)
        msg = hash_seed_problem({HASH_SEED: hash_seed})
        if msg is not None:
            warnings.warn(msg, ReplayEnvironmentWarning, stacklevel=2)
    pin_blas()


def reexec_for(hash_seed: str, args: list[str]) -> None:
    """Re-execute the CLI as ``replay ARGS`` under ``hash_seed``, unless this process
    already has that seed, was already re-executed for it (``python -E`` ignores the
    variable) or has initialised MPI.  The console script calls it before importing the
    CLI (~1.5 s), so that :func:`ensure` rarely has to after."""
    if (
        current_hash_seed() != hash_seed
        and os.environ.get(REEXEC_MARKER) != hash_seed
        and "mpi4py.MPI" not in sys.modules  # MPI_Init cannot run twice in one pid
    ):
        _reexec(hash_seed, args)


def _reexec(hash_seed: str, args: list[str]) -> None:
    env = dict(os.environ, **worker_env(hash_seed))
    env[REEXEC_MARKER] = hash_seed
    # keep interpreter options (-X, -W, ...) and how replay was started, when known
    orig = list(getattr(sys, "orig_argv", []))
    n = len(orig) - len(args)
    ok = n >= 2 and orig[n:] == args and "-c" not in orig[1:n]
    argv = [sys.executable, *(orig[1:n] if ok else ["-m", "replay"]), *args]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


class ReplayEnvironmentWarning(RuntimeWarning):
    """A replay runs in another environment than its run: it may diverge for that reason."""


def hash_seed_problem(environment: Mapping[str, Any]) -> str | None:
    """Why this process's hash seed may not reproduce a run's set orders (None: it does).

    ``environment`` is the run's record; an old trace without one gives None.
    """
    if HASH_SEED not in environment:
        return None
    needed = recorded_hash_seed(environment)
    if needed is None:
        return (
            "the run was recorded with a random PYTHONHASHSEED: sets of strings may "
            "iterate in another order in this replay"
        )
    have = current_hash_seed()
    if have == needed:
        return None
    return (
        f"this process has PYTHONHASHSEED={have or 'random'} but the run had {needed}: "
        f"sets of strings may iterate in another order; start Python with "
        f"PYTHONHASHSEED={needed} (the replay CLI does this itself)"
    )


def float_change(environment: Mapping[str, Any], doing: str = "this replay") -> str | None:
    """One line when this process computes floats on other code paths than the run
    did (numpy's SIMD targets, the OpenBLAS kernels), or None (also for a trace that did
    not record them); ``doing`` names what would compute them.  Values read from the
    trace are only compared and shown, and suggested as variables only when each is a
    plain name."""
    here = float_paths()
    diffs, hint = [], []
    for key, what in (("simd", "numpy SIMD"), ("blas_core", "OpenBLAS kernels")):
        had, have = environment.get(key), here[key]
        if had is None or have is None or had == have:
            continue
        names = [str(x) for x in had] if isinstance(had, list) else str(had).split(",")
        now = have if isinstance(have, list) else str(have).split(",")
        shown = "".join(c if c.isprintable() else "?" for c in " ".join(names)[:80])
        diffs.append(f"{what} {shown or 'none'} → {' '.join(now) or 'none'}")
        if len(names) > 16 or not all(_NAME.fullmatch(n) for n in names):
            continue
        if key == "blas_core" and len(names) == 1:
            hint.append(f"OPENBLAS_CORETYPE={names[0]}")
        elif key == "simd" and names:
            hint.append(f"NPY_ENABLE_CPU_FEATURES='{' '.join(names)}'")
        elif key == "simd":  # none: every dispatched target off
            hint.append(f"NPY_DISABLE_CPU_FEATURES='{' '.join(_dispatched())}'")
    if not diffs:
        return None
    how = f"on a CPU that has them, set {' '.join(hint)} to match them, or " if hint else ""
    return (
        f"{doing} computes floats on other CPU code paths than the run "
        f"({'; '.join(diffs)}): sums may differ in their last bits; {how}use a CPU "
        "like the recording one"
    )


def _dispatched() -> list[str]:
    """numpy's dispatchable SIMD targets (whether this CPU has them or not)."""
    return [str(f) for f in getattr(_umath(), "__cpu_dispatch__", [])]


def _umath() -> Any:
    """numpy's C core module, which names its SIMD targets (None: not found)."""
    import importlib

    for name in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def version_change(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """One line naming the versions that differ (recorded → current), or None."""
    diffs = [
        f"{k} {recorded[k]} → {current.get(k, 'none')}"
        for k in VERSION_KEYS
        if k in recorded and recorded[k] != current.get(k, "none")
    ]
    if not diffs:
        return None
    return (
        f"the trace was recorded under other versions ({', '.join(diffs)}); "
        "the replay may diverge for that reason"
    )


def object_text_change(recorded: Mapping[str, Any]) -> str | None:
    """One line when the run's Python-object elements were digested by another text than
    this replay's (``engine.lowlevel.OBJECT_TEXT_VERSION``), or None.  A run recorded by
    the CLI before the version was recorded used the ``repr`` (version 1)."""
    if not recorded:  # no versions recorded at all: nothing known
        return None
    from engine.lowlevel import OBJECT_TEXT_VERSION

    had = str(recorded.get(OBJECT_TEXT, "1"))
    if had == str(OBJECT_TEXT_VERSION):
        return None
    return (
        f"the trace digested Python-object DDS elements by their repr (object text {had}, "
        f"this replay uses {OBJECT_TEXT_VERSION}, exact since 2026-11-28): if its object "
        "elements hold arrays or objects, their digests will differ; re-record the run"
    )


def warn_replay_environment(
    environment: Mapping[str, Any], recorded: Mapping[str, Any], *, here: bool = True
) -> None:
    """Warn about what in this process differs from a recorded run's environment
    (hash seed, only if the replay runs ``here``, not in ranks that get it from
    :func:`worker_env`; floating-point paths) and ``recorded`` versions."""
    problem = hash_seed_problem(environment) if here else None
    paths = float_change(environment)  # ranks started here inherit this process's paths
    changed = version_change(recorded, versions())
    for msg in (problem, paths, changed, object_text_change(recorded)):
        if msg is not None:
            warnings.warn(msg, ReplayEnvironmentWarning, stacklevel=2)


def versions() -> dict[str, str]:
    """Python and package versions of this process (recorded with every run)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from engine.lowlevel import OBJECT_TEXT_VERSION

    out = {"python": platform.python_version(), OBJECT_TEXT: str(OBJECT_TEXT_VERSION)}
    for pkg in ("strads-replay", "numpy", "scipy", "mpi4py", "mpich", "SQLAlchemy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def one_line_warnings() -> None:
    """Show :class:`ReplayEnvironmentWarning` as one ``replay: warning:`` line (the CLI)."""
    original = warnings.formatwarning
    if getattr(original, "_replay_one_line", False):
        return  # installed already: wrapping again on every in-process call would nest

    def fmt(message: Any, category: Any, *args: Any, **kwargs: Any) -> str:
        if issubclass(category, ReplayEnvironmentWarning):
            return f"replay: warning: {message}\n"
        return original(message, category, *args, **kwargs)

    fmt._replay_one_line = True  # type: ignore[attr-defined]
    warnings.formatwarning = fmt


def check_ranks_agree(comm: Any, code: tuple[str, str] | None = None) -> None:
    """Every rank of ``comm`` must have the same hash seed (set orders agree) and, given
    ``code`` (the app's source file and its digest on this rank), the same app source:
    ranks on hosts whose copies of the file differ would each run their own program."""
    import socket

    from ._errors import RanksDisagree

    paths = float_paths()
    mine = (current_hash_seed() or "random", code, socket.gethostname(), paths)
    got = comm.allgather(mine)
    seeds = [seed for seed, *_ in got]
    if len(set(seeds)) > 1:
        shown = ", ".join(f"rank {r}: {s}" for r, s in enumerate(seeds))
        raise RanksDisagree(
            f"the MPI ranks run with different PYTHONHASHSEED values ({shown}); "
            "give every rank the same value, e.g. 'PYTHONHASHSEED=0 mpiexec ...'"
        )
    codes = [c for _, c, *_ in got]
    if code is not None and len({c[1] if c else None for c in codes}) > 1:
        shown = ", ".join(
            f"rank {r} on {host}: {c[1][:12] if c and c[1] else 'missing'}"
            for r, (_, c, host, _) in enumerate(got)
        )
        raise RanksDisagree(
            f"the MPI ranks run different copies of {code[0]} (digests {shown}); "
            "put the same file at that path on every host (check out one commit everywhere)"
        )
    if len({repr(p) for *_, p in got}) > 1:
        shown = "; ".join(
            f"rank {r} on {host}: {paths_text(p)}" for r, (*_, host, p) in enumerate(got)
        )
        raise RanksDisagree(
            f"the MPI ranks compute floats on different CPU code paths ({shown}), so their "
            "sums would differ in the last bits; run every rank on a CPU with AVX2 and FMA, "
            "or set NPY_ENABLE_CPU_FEATURES and OPENBLAS_CORETYPE alike for every rank"
        )


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """Import the heavy modules (numpy, SQLAlchemy, mpi4py, the engine) with the cyclic
    collector paused, then freeze what they made: the collector would walk those
    long-lived objects again in every later collection.  A process pays these imports
    on every command and every MPI rank; pausing saves about 8% of their CPU."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


__all__ = [
    "ReplayEnvironmentWarning",
    "allow_reexec",
    "check_ranks_agree",
    "choose_hash_seed",
    "current_hash_seed",
    "ensure",
    "float_change",
    "float_env",
    "float_paths",
    "one_line_warnings",
    "paths_text",
    "pin_blas",
    "pin_float",
    "portable_float",
    "quiet_imports",
    "record",
    "recorded_hash_seed",
    "version_change",
    "versions",
    "warn_replay_environment",
    "worker_env",
]
