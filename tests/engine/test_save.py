"""``ap.save``: a model a user loads with numpy alone, written atomically, never through a
link, onto a directory or over a trace store, and refused when numpy could not load it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine as ap
from engine.lowlevel import write_model


def _model() -> dict[str, np.ndarray]:
    X = ap.dvector(5, shape=(3,), init=ap.init.uniform(-1.0, 1.0), name="X")
    b = ap.dvector(5, shape=(), init=ap.init.normal(0.0, 1.0), name="b")
    return {"X": X.gather(), "b": b.gather(), "X_dds": X, "b_dds": b}


@pytest.mark.parametrize("nodes", [1, 3])
def test_npz_holds_every_dds_and_array_and_loads_without_pickle(nodes: int, tmp_path: Path) -> None:
    out = tmp_path / "m.npz"

    def prog() -> dict[str, np.ndarray]:
        m = _model()
        ap.save(out, X=m["X_dds"], b=m["b_dds"], names=["a", "bb", "c", "d", "e"], k=np.int64(3))
        return m

    m = ap.run(prog, nodes=nodes, seed=4).value
    with np.load(out) as z:  # allow_pickle=False: numpy's default
        assert sorted(z.files) == ["X", "b", "k", "names"]
        assert np.array_equal(z["X"], m["X"]) and z["X"].shape == (5, 3)
        assert np.array_equal(z["b"], m["b"]) and z["b"].shape == (5,)
        assert z["names"].tolist() == ["a", "bb", "c", "d", "e"] and int(z["k"]) == 3


def test_text_format_is_gensims_and_round_trips_the_vectors(tmp_path: Path) -> None:
    vec = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    words = ["the", "ca\u00f1a", "x1", "Z"]
    write_model(tmp_path / "v.txt", {"vectors": vec, "vocab": words})
    lines = (tmp_path / "v.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "4 3" and len(lines) == 5
    got = [line.split(" ") for line in lines[1:]]
    assert [g[0] for g in got] == words and all(len(g) == 4 for g in got)
    back = np.array([[float(x) for x in g[1:]] for g in got], dtype=np.float32)
    assert np.array_equal(back, vec)  # 9 significant digits: a float32 exactly


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"vectors": np.zeros((2, 3))}, "one embedding"),
        ({"vectors": np.zeros((2, 3)), "vocab": ["a"]}, "2 rows, vocab 1 words"),
        ({"vectors": np.zeros((2, 3)), "vocab": ["a", "b c"]}, "vocab[1] = 'b c'"),
        ({"vectors": np.zeros((1, 3)), "vocab": ["a"], "more": [1]}, "one embedding"),
    ],
)
def test_text_format_refuses_what_it_cannot_hold(
    arrays: dict[str, object], message: str, tmp_path: Path
) -> None:
    with pytest.raises(ap.SaveError, match=re.escape(message)):
        write_model(tmp_path / "v.txt", arrays)
    assert not (tmp_path / "v.txt").exists()


def test_python_objects_and_unknown_formats_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ap.SaveError, match="allow_pickle"):
        write_model(tmp_path / "m.npz", {"x": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(ap.SaveError, match=r"name it \.npz"):
        write_model(tmp_path / "m.csv", {"x": [1.0]})
    assert os.listdir(tmp_path) == []


def test_save_replaces_a_file_but_never_a_link_directory_or_trace(tmp_path: Path) -> None:
    old = tmp_path / "m.npz"
    old.write_bytes(b"old")
    (tmp_path / "d.npz").mkdir()
    (tmp_path / "t.npz").write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    (tmp_path / "l.npz").symlink_to(tmp_path / "elsewhere.npz")

    def prog(path: Path) -> None:
        X = ap.dvector(3, shape=(), init=ap.init.zeros(), name="X")
        ap.save(path, X=X)

    ap.run(prog, {"path": old}, nodes=2)
    with np.load(old) as kept:
        assert kept["X"].tolist() == [0.0, 0.0, 0.0]
    for name, why in (("d.npz", "directory"), ("t.npz", "trace store"), ("l.npz", "link")):
        with pytest.raises(ap.OutputPathError, match=why):
            ap.run(prog, {"path": tmp_path / name}, nodes=2)
    assert not (tmp_path / "elsewhere.npz").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz", "l.npz", "m.npz", "t.npz"]


#: Names a writer's own parameters use: ``np.savez(file, *args, allow_pickle, **kwds)``
#: and ``ap.save(path, **arrays)``; each is a fine name for an array all the same.
CLASHING = ["file", "allow_pickle", "args", "kwds", "path", "arrays", "force", "label"]
NAMES = st.one_of(
    st.sampled_from(CLASHING), st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
)
ARRAYS = st.one_of(
    st.lists(st.floats(allow_nan=False), max_size=4).map(np.array),
    st.lists(st.integers(-(2**40), 2**40), max_size=4).map(np.array),
    st.lists(st.text("ab\u00f1", min_size=1, max_size=3), min_size=1, max_size=3),
)


@given(model=st.dictionaries(NAMES, ARRAYS, min_size=1, max_size=4))
def test_every_identifier_is_an_array_numpy_loads_back(
    model: dict[str, object], tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = tmp_path_factory.mktemp("npz") / "m.npz"
    write_model(out, model)
    with np.load(out) as z:  # numpy alone, allow_pickle=False
        assert z.files == list(model)
        for name, value in model.items():
            assert np.array_equal(z[name], np.asarray(value)), name


def test_ap_save_takes_any_array_name_its_own_path_too(tmp_path: Path) -> None:
    out = tmp_path / "m.npz"

    def prog() -> None:
        X = ap.dvector(2, shape=(), init=ap.init.zeros(), name="X")
        ap.save(out, path=X, file=np.arange(2), allow_pickle=["a", "b"])

    ap.run(prog, nodes=2)
    with np.load(out) as z:
        assert z.files == ["path", "file", "allow_pickle"]
        assert z["allow_pickle"].tolist() == ["a", "b"] and z["file"].tolist() == [0, 1]
