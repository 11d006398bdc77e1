"""The compiled task loop of a kernel is kept in numba's disk cache, one per kernel.

The loop calls its kernel as a global, which numba's cache key for the loop does not
see, so the loop's file must stand for exactly one body: the class of failure is a
cached loop that runs another body (a closure made by the same code with other cells,
an edited kernel file, another kernel of the same name) or an old copy of it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap
from engine._asyncfor import compiled


def _adder(c: float):
    @ap.kernel
    def add(j, X):
        X[j] = X[j] + c

    return add


def test_closures_of_one_kernel_function_each_run_their_own_body() -> None:
    def prog():
        X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")
        for c in (1.0, 10.0, 100.0):
            ap.async_for(0, 4, _adder(c).bind(X), name=f"add{c:g}")
        return X.gather()

    assert ap.run(prog).value.tolist() == [111.0] * 4


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(allow_nan=False), min_size=2, max_size=5))
def test_a_loop_file_stands_for_one_closure(cs: list[float]) -> None:
    paths = [compiled.loop_file(_adder(c).py_func, 1, "f") for c in cs]
    assert all(p is not None for p in paths)
    assert len(set(paths)) == len({np.float64(c).tobytes() for c in cs})
    assert paths[0] == compiled.loop_file(_adder(cs[0]).py_func, 1, "f")  # stable
    assert paths[0] != compiled.loop_file(_adder(cs[0]).py_func, 2, "f")  # per argument count
    assert paths[0] != compiled.loop_file(_adder(cs[0]).py_func, 1, "g")  # per frozen values


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_an_edited_kernel_file_gets_a_new_loop(tmp_path: Path) -> None:
    src = tmp_path / "user_kernel.py"
    text = "import engine as ap\n\n@ap.kernel\ndef k(j, X):\n    X[j] = X[j] + {}\n"
    src.write_text(text.format("1.0"))
    first = compiled.loop_file(_load(src, "user_kernel_a").k.py_func, 1, "f")
    src.write_text(text.format("2.0"))
    second = compiled.loop_file(_load(src, "user_kernel_b").k.py_func, 1, "f")
    assert first is not None and second is not None and first != second


def test_a_kernel_without_a_source_file_gets_an_uncached_loop() -> None:
    scope: dict = {"ap": ap}
    exec("@ap.kernel\ndef k(j, X):\n    X[j] = X[j] + 1.0\n", scope)  # noqa: S102
    assert compiled.loop_file(scope["k"].py_func, 1, "f") is None

    def prog():
        X = ap.dvector(3, shape=(), init=ap.init.zeros(), name="X")
        ap.async_for(0, 3, scope["k"].bind(X), name="k")
        return X.gather()

    assert ap.run(prog).value.tolist() == [1.0] * 3


def test_the_loop_is_loaded_from_the_disk_cache() -> None:
    """What a second process does: a new loop for the same body loads the saved one."""
    kern = _adder(0.5)

    def prog():
        X = ap.dvector(2, shape=(), init=ap.init.zeros(), name="X")
        ap.async_for(0, 2, kern.bind(X), name="half")
        return X.gather()

    assert ap.run(prog).value.tolist() == [0.5, 0.5]
    (frozen, body), *_ = kern._bodies.items()
    (_, n), first = next((k, v) for k, v in compiled._LOOPS.items() if k[0] is body)
    again = compiled._kernel_loop(body, n, frozen)
    assert again is not None and again is not first
    X = np.zeros(2)
    state = np.zeros(compiled.STATE_LEN, dtype=np.int64)
    gm = np.zeros(2, np.uint8)
    rows = compiled.Rows(X, gm, 0, compiled.EXEC, 0, state, compiled.no_sets(), 0, 0)
    again(np.arange(2, dtype=np.int64), state, rows)
    assert X.tolist() == [0.5, 0.5]
    assert sum(again.stats.cache_hits.values()) == 1 and not again.stats.cache_misses


# ------------------------------------------------------------- what compiling freezes
# numba compiles the values a kernel reads outside its arguments (a module's global
# number, tuple or array, a default argument, a jitted helper in another file) into its
# machine code and keys its disk cache by the kernel's own file only: a changed value
# or helper must give another body and loop, never the cached one.
_USER = """\
import numba
import numpy as np

import engine as ap
import {helpers} as helpers

C = {c!r}
TABLE = np.array({table!r})


@ap.kernel
def k(j, X, d={d!r}):
    X[j] = X[j] + C + TABLE[j % len(TABLE)] + d + helpers.f(j)
"""
_HELPERS = "import numba\n\n\n@numba.njit\ndef f(j):\n    return {h!r} * j\n"


def _user_module(tmp_path: Path, name: str, c, table, d, h):  # noqa: ANN001, ANN202
    (tmp_path / f"{name}_helpers.py").write_text(_HELPERS.format(h=h))
    src = tmp_path / f"{name}.py"
    src.write_text(_USER.format(helpers=f"{name}_helpers", c=c, table=table, d=d, h=h))
    sys.path.insert(0, str(tmp_path))
    try:
        sys.modules.pop(f"{name}_helpers", None)
        return _load(src, name)
    finally:
        sys.path.remove(str(tmp_path))


_FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=32)
_VALUES = st.tuples(_FLOATS, st.lists(_FLOATS, min_size=1, max_size=3), _FLOATS, _FLOATS)


@settings(max_examples=20, deadline=None)
@given(_VALUES, _VALUES)
def test_the_frozen_digest_changes_with_every_value_compiling_reads(a, b) -> None:  # noqa: ANN001
    """The same file path and module name, as a second process sees them: (C, TABLE, the
    default d, the helper's constant in its own file)."""
    import tempfile

    from engine._asyncfor.frozen import digest

    with tempfile.TemporaryDirectory() as tmp:
        da = digest(_user_module(Path(tmp), "frozen_user", *a).k.py_func)
        mod = _user_module(Path(tmp), "frozen_user", *b)
        db = digest(mod.k.py_func)
        assert (da == db) == (repr(a) == repr(b)), (a, b)
        mod.C = float(
            np.nextafter(b[0], np.inf)
        )  # a global set at run time (from the environment, a data file)
        assert digest(mod.k.py_func) != db


def test_a_global_changed_since_compiling_never_runs_the_old_body(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel reads ``C = float(os.environ[...])``-like globals: a later run in this
    process (a notebook) and a second process (a new kernel object over the same file)
    compute what the Python function computes now, not what the cache holds."""
    from numba.core import config

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path / "cache"))
    mod = _user_module(tmp_path, "glob_user", 1.0, [10.0, 20.0], 0.5, 100.0)

    def run(body_of):  # noqa: ANN001, ANN202
        def prog():
            X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")
            ap.async_for(0, 4, body_of(X), name="k")
            return X.gather()

        return ap.run(prog, nodes=2).value.tolist()

    def python(X):  # noqa: ANN001, ANN202
        return mod.k.bind(X).python

    assert run(mod.k.bind) == run(python) == [11.5, 121.5, 211.5, 321.5]
    mod.C, mod.TABLE = 2.0, np.array([30.0])
    assert run(mod.k.bind) == run(python) == [32.5, 132.5, 232.5, 332.5]
    # a new process with those values: numba's cache holds the first run's body too
    assert run(ap.kernel(mod.k.py_func).bind) == run(python) == [32.5, 132.5, 232.5, 332.5]


def test_two_kernels_of_one_name_in_one_function_each_run_their_own_body() -> None:
    """Same module, qualified name, file and (no) cells: only their code tells them apart
    (a test that defines ``k`` twice, a notebook cell run again after an edit)."""

    def prog():
        X = ap.dvector(2, shape=(), init=ap.init.zeros(), name="X")
        got = []

        @ap.kernel
        def k(j, X):  # noqa: ANN001, ANN202
            X[j] = 1.0

        ap.async_for(0, 2, k.bind(X), name="one")
        got.append(X.gather().tolist())

        @ap.kernel
        def k(j, X):  # noqa: ANN001, ANN202, F811
            X[j] = 2.0

        ap.async_for(0, 2, k.bind(X), name="two")
        got.append(X.gather().tolist())
        return got

    assert ap.run(prog).value == [[1.0, 1.0], [2.0, 2.0]]


@pytest.mark.parametrize("keeps_mtime", [False, True])
def test_a_kept_file_digest_sees_every_edit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keeps_mtime: bool
) -> None:
    """A helper file's digest is kept while its stat is unchanged: an edit of the same size,
    even with its mtime set back, moves its ctime, so the digest is taken again; a file
    changed less than ``RACY_NS`` before it was read is never kept."""
    import os
    import time

    from engine._asyncfor import frozen

    src = tmp_path / "helper.py"
    src.write_text("A = 1\n")
    first = frozen._file_digest(str(src))
    assert str(src) not in frozen._FILES  # just written: racily clean, read every time
    monkeypatch.setattr(frozen, "RACY_NS", 0)
    assert frozen._file_digest(str(src)) == first and str(src) in frozen._FILES
    before = os.stat(src)
    time.sleep(0.02)  # past the file system's clock tick
    src.write_text("A = 2\n")  # the same size
    if keeps_mtime:
        os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert frozen._file_digest(str(src)) != first
