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
    paths = [compiled.loop_file(_adder(c).py_func, 1) for c in cs]
    assert all(p is not None for p in paths)
    assert len(set(paths)) == len({np.float64(c).tobytes() for c in cs})
    assert paths[0] == compiled.loop_file(_adder(cs[0]).py_func, 1)  # stable
    assert paths[0] != compiled.loop_file(_adder(cs[0]).py_func, 2)  # per argument count


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
    first = compiled.loop_file(_load(src, "user_kernel_a").k.py_func, 1)
    src.write_text(text.format("2.0"))
    second = compiled.loop_file(_load(src, "user_kernel_b").k.py_func, 1)
    assert first is not None and second is not None and first != second


def test_a_kernel_without_a_source_file_gets_an_uncached_loop() -> None:
    scope: dict = {"ap": ap}
    exec("@ap.kernel\ndef k(j, X):\n    X[j] = X[j] + 1.0\n", scope)  # noqa: S102
    assert compiled.loop_file(scope["k"].py_func, 1) is None

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
    (body, n), first = next((k, v) for k, v in compiled._LOOPS.items() if k[0] is kern._body)
    again = compiled._kernel_loop(body, n)
    assert again is not None and again is not first
    X = np.zeros(2)
    state = np.zeros(compiled.STATE_LEN, dtype=np.int64)
    gm = np.zeros(2, np.uint8)
    rows = compiled.Rows(X, gm, 0, compiled.EXEC, 0, state, compiled.no_sets(), 0, 0)
    again(np.arange(2, dtype=np.int64), state, rows)
    assert X.tolist() == [0.5, 0.5]
    assert sum(again.stats.cache_hits.values()) == 1 and not again.stats.cache_misses
