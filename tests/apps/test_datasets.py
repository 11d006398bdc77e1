"""Tests for apps._datasets: cache, wheel extraction, synthetic ratings and line parsing."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile
from collections import Counter

import numpy as np
import pytest

from apps import _datasets
from apps._datasets import (
    RATINGS_HEADER,
    DatasetUnavailableError,
    Rating,
    cache_dir,
    fetch_wheel_member,
    movielens_100k,
    parse_rating_line,
    synthetic_ratings,
)
from apps._errors import AppError
from tests import cli as tcli

MEMBER = "fakepkg/data/ratings.inter"
OTHER_MEMBER = "fakepkg/data/readme.txt"
MEMBER_BYTES = f"{RATINGS_HEADER}\n1\t2\t3\t881250949\n".encode()


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """Point the data set cache at a fresh temporary directory."""
    root = tmp_path / "cache"
    monkeypatch.setenv("STRADS_REPLAY_CACHE", str(root))
    return root


@pytest.fixture
def fake_wheel(tmp_path: pathlib.Path) -> pathlib.Path:
    """Build a tiny wheel whose code would fail loudly if anything ran it."""
    wheel = tmp_path / "fakepkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fakepkg/__init__.py", "raise SystemExit('wheel code was executed')\n")
        zf.writestr(MEMBER, MEMBER_BYTES)
        zf.writestr(OTHER_MEMBER, "not wanted\n")
        zf.writestr("fakepkg-1.0.dist-info/METADATA", "Name: fakepkg\nVersion: 1.0\n")
    return wheel


class FakePip:
    """Stand-in for subprocess.run that records calls and 'downloads' a prepared wheel."""

    def __init__(self, wheel: pathlib.Path | None, returncode: int = 0, stderr: str = "") -> None:
        self.wheel = wheel
        self.returncode = returncode
        self.stderr = stderr
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(cmd))
        self.kwargs = kwargs
        assert kwargs.get("timeout") == 300
        assert kwargs.get("stderr") == subprocess.PIPE  # pip's reason for a failure
        if self.returncode == 0 and self.wheel is not None:
            dest = pathlib.Path(cmd[cmd.index("--dest") + 1])
            shutil.copy(self.wheel, dest / self.wheel.name)
        return subprocess.CompletedProcess(cmd, self.returncode, stdout="", stderr=self.stderr)


def install_pip(monkeypatch: pytest.MonkeyPatch, fake: FakePip) -> FakePip:
    """Route the module's subprocess.run through ``fake``."""
    monkeypatch.setattr(_datasets.subprocess, "run", fake)
    return fake


# --- cache_dir --------------------------------------------------------------------------------


def test_cache_dir_uses_env_var_and_creates_it(isolated_cache: pathlib.Path) -> None:
    path = cache_dir()
    assert path == isolated_cache / "datasets"
    assert path.is_dir()


def test_cache_dir_defaults_to_platformdirs(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STRADS_REPLAY_CACHE")
    seen: list[str] = []

    def fake_user_cache_dir(appname: str) -> str:
        seen.append(appname)
        return str(tmp_path / "platform")

    monkeypatch.setattr(_datasets.platformdirs, "user_cache_dir", fake_user_cache_dir)
    assert cache_dir() == tmp_path / "platform" / "datasets"
    assert seen == ["strads-replay"]
    assert (tmp_path / "platform" / "datasets").is_dir()


@pytest.mark.parametrize("blocked", ["root", "datasets", "member"])
def test_a_cache_that_cannot_be_written_is_one_line_naming_the_variable(
    isolated_cache: pathlib.Path,
    fake_wheel: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    blocked: str,
) -> None:
    """A file where the cache (or a directory in it) belongs gave NotADirectoryError from
    inside this module: the program's error, exit 1, with no word of what to do."""
    install_pip(monkeypatch, FakePip(fake_wheel))
    in_the_way = {
        "root": isolated_cache,
        "datasets": isolated_cache / "datasets",
        "member": isolated_cache / "datasets" / "fake",
    }[blocked]
    in_the_way.parent.mkdir(parents=True, exist_ok=True)
    in_the_way.write_text("a file, not a directory")
    with pytest.raises(DatasetUnavailableError, match="set STRADS_REPLAY_CACHE to a writable"):
        fetch_wheel_member("fakepkg", "1.0", [MEMBER], "fake")


@pytest.mark.parametrize(
    "app,blocked",
    [
        ("sgdmf", "cache"),  # MovieLens: refused before any download
        ("sgdmf -p synthetic=true", "cache"),
        ("sgdmf -p synthetic=true", "synthetic"),
        ("transe -p synthetic=true", "synthetic"),
    ],
)
def test_an_app_whose_cache_cannot_be_written_exits_2_in_one_line(
    isolated_cache: pathlib.Path, app: str, blocked: str
) -> None:
    in_the_way = isolated_cache if blocked == "cache" else isolated_cache / "datasets" / blocked
    in_the_way.parent.mkdir(parents=True, exist_ok=True)
    in_the_way.write_text("a file, not a directory")
    env = {"STRADS_REPLAY_CACHE": str(isolated_cache)}
    res = tcli.invoke(["run", *app.split(), "-p", "epochs=1", "--no-trace", "-q"], env=env)
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, err)
    assert len(err.splitlines()) == 1 and "set STRADS_REPLAY_CACHE to a writable" in err, err
    assert str(in_the_way) in err, err


# --- fetch_wheel_member -----------------------------------------------------------------------


def test_fetch_extracts_only_listed_member_flattened(
    fake_wheel: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pip = install_pip(monkeypatch, FakePip(fake_wheel))
    dest = fetch_wheel_member("fakepkg", "1.0", [MEMBER], "fake")

    assert dest == cache_dir() / "fake"
    assert sorted(p.name for p in dest.iterdir()) == ["ratings.inter"]
    assert (dest / "ratings.inter").read_bytes() == MEMBER_BYTES
    [cmd] = pip.calls
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in cmd
    assert "--only-binary=:all:" in cmd
    assert cmd[-1] == "fakepkg==1.0"


def test_fetch_without_version_asks_for_bare_package(
    fake_wheel: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pip = install_pip(monkeypatch, FakePip(fake_wheel))
    fetch_wheel_member("fakepkg", None, [MEMBER, OTHER_MEMBER], "fake")
    assert pip.calls[0][-1] == "fakepkg"
    assert (cache_dir() / "fake" / "readme.txt").read_text() == "not wanted\n"


def test_second_fetch_uses_cache_without_pip(
    fake_wheel: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pip = install_pip(monkeypatch, FakePip(fake_wheel))
    first = fetch_wheel_member("fakepkg", "1.0", [MEMBER], "fake")
    second = fetch_wheel_member("fakepkg", "1.0", [MEMBER], "fake")
    assert first == second
    assert len(pip.calls) == 1


def test_fetch_again_when_a_member_is_missing_from_cache(
    fake_wheel: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pip = install_pip(monkeypatch, FakePip(fake_wheel))
    fetch_wheel_member("fakepkg", "1.0", [MEMBER], "fake")
    dest = fetch_wheel_member("fakepkg", "1.0", [MEMBER, OTHER_MEMBER], "fake")
    assert len(pip.calls) == 2
    assert sorted(p.name for p in dest.iterdir()) == ["ratings.inter", "readme.txt"]


def test_missing_member_raises_naming_package(
    fake_wheel: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_pip(monkeypatch, FakePip(fake_wheel))
    with pytest.raises(DatasetUnavailableError) as info:
        fetch_wheel_member("fakepkg", "1.0", [MEMBER, "fakepkg/data/absent.csv"], "fake")
    message = str(info.value)
    assert "fakepkg==1.0" in message
    assert "fakepkg/data/absent.csv" in message
    assert "synthetic=true" in message
    # Nothing is extracted when the wheel lacks any requested member.
    assert not (cache_dir() / "fake").exists()


def test_failing_pip_raises_with_pip_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = (
        "WARNING: Retrying (Retry(total=4)) after connection broken\n"
        "ERROR: Could not find a version that satisfies the requirement fakepkg==9.9\n"
        "ERROR: No matching distribution found for fakepkg==9.9\n"
    )
    install_pip(monkeypatch, FakePip(None, returncode=1, stderr=stderr))
    with pytest.raises(DatasetUnavailableError) as info:
        fetch_wheel_member("fakepkg", "9.9", [MEMBER], "fake")
    message = str(info.value)
    assert isinstance(info.value, AppError)
    assert isinstance(info.value, RuntimeError)
    assert "\n" not in message
    assert "fakepkg==9.9" in message
    assert "Could not find a version that satisfies the requirement" in message
    assert "check network access to PyPI, or pass -p synthetic=true" in message


def test_pip_timeout_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def timing_out(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(cmd, 300)

    monkeypatch.setattr(_datasets.subprocess, "run", timing_out)
    with pytest.raises(DatasetUnavailableError, match=r"fakepkg==1\.0.*timed out after 300 s"):
        fetch_wheel_member("fakepkg", "1.0", [MEMBER], "fake")


def test_pip_without_wheel_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    install_pip(monkeypatch, FakePip(None))
    with pytest.raises(DatasetUnavailableError, match="produced no wheel"):
        fetch_wheel_member("fakepkg", "1.0", [MEMBER], "fake")


def test_corrupt_wheel_raises(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "fakepkg-1.0-py3-none-any.whl"
    broken.write_bytes(b"this is not a zip file")
    install_pip(monkeypatch, FakePip(broken))
    with pytest.raises(DatasetUnavailableError, match="not a readable wheel"):
        fetch_wheel_member("fakepkg", "1.0", [MEMBER], "fake")


def test_fetch_rejects_dest_outside_cache() -> None:
    with pytest.raises(ValueError, match="relative path inside the cache"):
        fetch_wheel_member("fakepkg", "1.0", [MEMBER], "../escape")


def test_interrupted_write_leaves_no_file(
    fake_wheel: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_pip(monkeypatch, FakePip(fake_wheel))

    def dying_replace(src: object, dst: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_datasets.os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        fetch_wheel_member("fakepkg", "1.0", [MEMBER], "fake")
    assert list((cache_dir() / "fake").iterdir()) == []


# --- movielens_100k ---------------------------------------------------------------------------


def test_movielens_100k_requests_recbole_member(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = tmp_path / "recbole-1.2.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("recbole/dataset_example/ml-100k/ml-100k.inter", MEMBER_BYTES)
    pip = install_pip(monkeypatch, FakePip(wheel))
    path = movielens_100k()
    assert path == cache_dir() / "ml-100k" / "ml-100k.inter"
    assert path.read_bytes() == MEMBER_BYTES
    assert pip.calls[0][-1] == "recbole==1.2.1"


@pytest.mark.network
@pytest.mark.skipif(
    os.environ.get("STRADS_REPLAY_NETWORK_TESTS") != "1",
    reason="set STRADS_REPLAY_NETWORK_TESTS=1 to download from PyPI",
)
def test_movielens_100k_downloads_for_real() -> None:
    path = movielens_100k()
    lines = path.read_text().splitlines()
    assert len(lines) == 100001
    assert lines[0] == RATINGS_HEADER
    assert parse_rating_line(lines[1]) == Rating(195, 241, 3.0)


# --- synthetic_ratings ------------------------------------------------------------------------


def read_rows(path: pathlib.Path) -> list[list[str]]:
    """Return the data rows of a ratings file after checking its header."""
    lines = path.read_text().splitlines()
    assert lines[0] == RATINGS_HEADER
    return [line.split("\t") for line in lines[1:]]


def test_synthetic_format(tmp_path: pathlib.Path) -> None:
    path = synthetic_ratings(tmp_path / "syn.inter", n_users=40, n_items=60, n_ratings=700)
    assert path == tmp_path / "syn.inter"
    assert path.read_text().endswith("\n")
    rows = read_rows(path)
    assert len(rows) == 700
    for row in rows:
        assert len(row) == 4
        user, item, rating, timestamp = (int(field) for field in row)
        assert 1 <= user <= 40
        assert 1 <= item <= 60
        assert 1 <= rating <= 5
        assert timestamp > 0
        parsed = parse_rating_line("\t".join(row))
        assert parsed == Rating(user - 1, item - 1, float(rating))
    assert {int(row[2]) for row in rows} == {1, 2, 3, 4, 5}
    assert [p.name for p in tmp_path.iterdir()] == ["syn.inter"]


def test_synthetic_is_deterministic_per_seed(tmp_path: pathlib.Path) -> None:
    a = synthetic_ratings(tmp_path / "a.inter", seed=3).read_bytes()
    b = synthetic_ratings(tmp_path / "b.inter", seed=3).read_bytes()
    c = synthetic_ratings(tmp_path / "c.inter", seed=4).read_bytes()
    assert a == b
    assert a != c


def test_synthetic_has_no_duplicate_pairs(tmp_path: pathlib.Path) -> None:
    rows = read_rows(synthetic_ratings(tmp_path / "syn.inter"))
    pairs = [(row[0], row[1]) for row in rows]
    assert len(rows) == 20000
    assert len(set(pairs)) == len(pairs)


def test_synthetic_can_fill_the_whole_matrix(tmp_path: pathlib.Path) -> None:
    rows = read_rows(synthetic_ratings(tmp_path / "full.inter", n_users=7, n_items=5, n_ratings=35))
    assert {(int(r[0]), int(r[1])) for r in rows} == {
        (u, i) for u in range(1, 8) for i in range(1, 6)
    }


def test_synthetic_popularity_is_skewed_like_movielens(tmp_path: pathlib.Path) -> None:
    rows = read_rows(synthetic_ratings(tmp_path / "syn.inter"))
    item_counts = Counter(int(row[1]) for row in rows)
    user_counts = Counter(int(row[0]) for row in rows)
    assert item_counts[1] > 2 * np.median([item_counts[i] for i in range(1, 501)])
    assert user_counts[1] > 2 * np.median([user_counts[u] for u in range(1, 301)])
    head = sum(item_counts[i] for i in range(1, 51))
    tail = sum(item_counts[i] for i in range(451, 501))
    assert head > 3 * tail


def test_synthetic_ratings_resemble_movielens(tmp_path: pathlib.Path) -> None:
    ratings = np.array([int(row[2]) for row in read_rows(synthetic_ratings(tmp_path / "s.inter"))])
    assert 3.2 < ratings.mean() < 3.8
    assert 0.8 < ratings.std() < 1.4


def test_synthetic_rejects_impossible_sizes(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match=r"n_users \* n_items = 6, got 7"):
        synthetic_ratings(tmp_path / "x.inter", n_users=2, n_items=3, n_ratings=7)
    with pytest.raises(ValueError, match="must be >= 1"):
        synthetic_ratings(tmp_path / "x.inter", rank=0)
    assert not (tmp_path / "x.inter").exists()


# --- parse_rating_line ------------------------------------------------------------------------


def test_parse_good_lines() -> None:
    assert parse_rating_line("196\t242\t3\t881250949\n") == Rating(195, 241, 3.0)
    assert parse_rating_line("1\t1\t4.5\t874724710.0\r\n") == Rating(0, 0, 4.5)
    assert parse_rating_line("943\t1682\t1\t0") == Rating(942, 1681, 1.0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("196\t242", "expected 4 tab-separated fields, got 2"),
        ("196 242 3 881250949", "expected 4 tab-separated fields, got 1"),
        ("1\t2\t3\t4\t5", "expected 4 tab-separated fields, got 5"),
        ("abc\t242\t3\t881250949", "user id 'abc' is not an integer"),
        ("196\t2.5\t3\t881250949", "item id '2.5' is not an integer"),
        ("0\t242\t3\t881250949", "user id 0 is not positive"),
        ("196\t242\tgood\t881250949", "rating 'good' is not a number"),
        ("196\t242\tnan\t881250949", "rating 'nan' is not finite"),
        ("196\t242\t3\tyesterday", "timestamp 'yesterday' is not a number"),
        (RATINGS_HEADER, "user id 'user_id:token' is not an integer"),
    ],
)
def test_parse_bad_lines(line: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_rating_line(line)
    assert str(info.value).startswith(message)


# --- progress ---------------------------------------------------------------------------------
@pytest.mark.parametrize("asked,terminal", [(True, True), (True, False), (False, True)])
def test_a_download_shows_pips_bar_only_to_a_person(
    monkeypatch: pytest.MonkeyPatch, fake_wheel: pathlib.Path, asked: bool, terminal: bool
) -> None:
    import os
    import pty

    master, slave = pty.openpty()
    stream = os.fdopen(slave if terminal else os.open(os.devnull, os.O_WRONLY), "w")
    try:
        monkeypatch.setattr(_datasets.sys, "stderr", stream)
        if asked:
            monkeypatch.setenv(_datasets.PROGRESS_ENV_VAR, "1")
        else:
            monkeypatch.delenv(_datasets.PROGRESS_ENV_VAR, raising=False)
        fake = install_pip(monkeypatch, FakePip(fake_wheel))
        fetch_wheel_member("fakepkg", "1.0", [MEMBER], "fake")
        (cmd,) = fake.calls
        shown = asked and terminal
        assert ("--progress-bar" in cmd) is shown
        assert fake.kwargs["stdout"] == (stream.fileno() if shown else subprocess.PIPE)
    finally:
        stream.close()
        os.close(master)
        if not terminal:
            os.close(slave)


def test_the_cli_and_the_datasets_agree_on_the_variable() -> None:
    from replay._progress import DOWNLOAD_PROGRESS_ENV

    assert DOWNLOAD_PROGRESS_ENV == _datasets.PROGRESS_ENV_VAR
