"""Fetching, caching and generating the rating data sets used by the example apps.

Real data comes from files shipped inside PyPI wheels: ``pip download`` fetches the wheel and
only the named members are read out of the zip, so no code from the wheel is ever run. Every
file lands in the cache through a temporary sibling and ``os.replace``, so a killed process
leaves either the old state or the complete file, never half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import pathlib
import posixpath
import secrets
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from typing import IO, NamedTuple

import numpy as np
import platformdirs

from engine import InputFileError
from engine.lowlevel import input_grew, open_input

from ._errors import AppError, DataFormatError

__all__ = [
    "CACHE_ENV_VAR",
    "RATINGS_HEADER",
    "DatasetUnavailableError",
    "Rating",
    "cache_dir",
    "cache_root",
    "writing_cache",
    "check_sha256",
    "fetch_checked_members",
    "fetch_wheel_member",
    "movielens_100k",
    "open_data",
    "parse_number",
    "parse_rating_line",
    "synthetic_ratings",
]

#: Environment variable naming the cache root; ``cache_dir()`` is its ``datasets`` subfolder.
CACHE_ENV_VAR = "STRADS_REPLAY_CACHE"

#: Header line of RecBole ``.inter`` rating files, written and expected without a newline.
#: The byte order mark some editors start a UTF-8 file with, as text.
BOM = "\ufeff"
RATINGS_HEADER = "user_id:token\titem_id:token\trating:float\ttimestamp:float"

#: Seconds ``pip download`` may take: room for a slow mirror, yet a dead network fails fast.
PIP_TIMEOUT_S = 300

#: What to tell the user when a download fails.
_FETCH_ADVICE = "check network access to PyPI, or pass -p synthetic=true to use generated data"

_MOVIELENS_PACKAGE = "recbole"
_MOVIELENS_VERSION = "1.2.1"
_MOVIELENS_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"

#: Zipf exponent of item popularity: higher puts more ratings on the few lowest item ids.
ITEM_POPULARITY_EXPONENT = 1.0
#: Added to an item's rank before the power; larger flattens the head of the distribution.
ITEM_POPULARITY_OFFSET = 20.0
#: Zipf exponent of user activity: higher makes a few low-id users rate far more than the rest.
USER_ACTIVITY_EXPONENT = 0.8
#: Added to a user's rank before the power; larger flattens the head of the distribution.
USER_ACTIVITY_OFFSET = 30.0
#: Spread of the low-rank part of a rating: larger makes ratings depend more on user-item fit.
RATING_SIGNAL_STD = 0.9
#: Spread of the per-user and per-item offsets, the part a rank-0 model with biases can fit.
RATING_BIAS_STD = 0.4
#: Standard deviation of the per-rating noise: larger makes the low-rank structure harder to fit.
RATING_NOISE_STD = 0.5
#: Mean rating before rounding and clipping; 3.6 gives the 3.5 average of MovieLens 100k.
RATING_MEAN = 3.6
#: Timestamp range of MovieLens 100k (September 1997 to April 1998), in Unix seconds.
TIMESTAMP_RANGE = (874_724_710, 893_286_638)


class DatasetUnavailableError(AppError, RuntimeError):
    """A data set could not be fetched or extracted."""


class Rating(NamedTuple):
    """One rating with 0-based user and item indices."""

    user: int
    item: int
    rating: float


@contextlib.contextmanager
def writing_cache() -> Iterator[None]:
    """Turn a failure to write into the data set cache (a path under a file, no
    permission, a full or read-only disk) into a one-line
    :class:`DatasetUnavailableError` that says where the cache is and how to move it;
    it was the program's own error, exit 1, naming a line of this module."""
    try:
        yield
    except OSError as exc:
        where = exc.filename if exc.filename is not None else cache_root()
        raise DatasetUnavailableError(
            f"cannot write the data set cache at {str(where)!r}: "
            f"{exc.strerror or type(exc).__name__}; set {CACHE_ENV_VAR} to a writable "
            "directory"
        ) from None


def cache_root() -> pathlib.Path:
    """The data set cache directory (:data:`CACHE_ENV_VAR`'s ``datasets``), unmade."""
    root = os.environ.get(CACHE_ENV_VAR) or platformdirs.user_cache_dir("strads-replay")
    return pathlib.Path(root).expanduser() / "datasets"


def cache_dir() -> pathlib.Path:
    """Return the data set cache directory, creating it if missing."""
    path = cache_root()
    with writing_cache():
        path.mkdir(parents=True, exist_ok=True)
    return path


def fetch_wheel_member(
    package: str, version: str | None, members: list[str], dest_subdir: str
) -> pathlib.Path:
    """Extract ``members`` of a PyPI wheel into ``cache_dir()/dest_subdir`` and return it."""
    names = [posixpath.basename(member) for member in members]
    if not members or "" in names or len(set(names)) != len(names):
        raise ValueError(f"members must be distinct file paths with distinct names, got {members}")
    if pathlib.PurePath(dest_subdir).is_absolute() or ".." in pathlib.PurePath(dest_subdir).parts:
        raise ValueError(
            f"dest_subdir must be a relative path inside the cache, got {dest_subdir!r}"
        )
    dest = cache_dir() / dest_subdir
    if all((dest / name).is_file() for name in names):
        return dest

    spec = package if version is None else f"{package}=={version}"
    with tempfile.TemporaryDirectory(prefix="strads-replay-wheel-") as tmp:
        wheel = _pip_download(spec, pathlib.Path(tmp))
        try:
            with zipfile.ZipFile(wheel) as zf:
                present = set(zf.namelist())
                missing = [member for member in members if member not in present]
                if missing:
                    raise _unavailable(spec, f"{wheel.name} has no member {missing[0]!r}")
                with writing_cache():
                    dest.mkdir(parents=True, exist_ok=True)
                    for member, name in zip(members, names, strict=True):
                        _atomic_write(dest / name, zf.read(member))
        except (zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
            raise _unavailable(spec, f"{wheel.name} is not a readable wheel ({exc})") from exc
    return dest


def open_data(path: str | os.PathLike[str], what: str) -> tuple[IO[bytes], int]:
    """A user's data file opened for reading, with its size (:func:`open_input`: a
    regular file only, since the path may come from a trace); else a one-line
    :class:`AppError` starting with ``what`` (e.g. ``"mlr: data"``)."""
    try:
        return open_input(path)
    except InputFileError as exc:
        why = getattr(exc, "why", None)
        if why is None:
            raise AppError(f"{what} file {str(path)!r} does not exist") from None
        raise AppError(f"{what} {str(path)!r} cannot be read: {why}") from None


def read_utf8(path: pathlib.Path, what: str, fix: str) -> str:
    """The text of ``path``; a missing, unreadable or non-UTF-8 file is a one-line
    :class:`AppError` starting with ``what`` (e.g. ``"lda: corpus"``) and, for bad bytes,
    ending with ``fix`` (what to give instead)."""
    fh, size = open_data(path, what)  # read to its size at the open
    try:
        with fh:
            data = fh.read(size + 1)
    except OSError as exc:
        raise AppError(f"{what} {str(path)!r} cannot be read: {exc.strerror}") from None
    if len(data) > size:
        raise AppError(f"{what}: {input_grew(str(path))}")
    # a byte order mark (Excel's "CSV UTF-8" and Notepad write one) is not text: kept, it
    # made a headerless table's first row a header, silently dropped, and a triple's
    # first entity another name than the same entity elsewhere
    try:
        return data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as exc:
        before = exc.object[: exc.start]  # its lines as text_lines counts them
        line = before.count(b"\n") + before.count(b"\r") - before.count(b"\r\n") + 1
        raise DataFormatError(
            f"{what} {str(path)!r} is not UTF-8 text (line {line}, byte {exc.start}): {fix}"
        ) from None


def text_lines(text: str) -> list[str]:
    """The lines of ``text`` as an editor numbers them: split at Python's universal
    newlines, ``\\n``, ``\\r\\n`` and a lone ``\\r`` (Excel for Mac's CSV), and nowhere
    else.  ``str.splitlines`` also breaks at a form feed, ``\\x1c``-``\\x1e``, U+0085,
    U+2028 and U+2029, so a document with a page break (as ``pdftotext`` writes) became
    two, and every line number after it was off from the editor's."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def check_sha256(path: pathlib.Path, want: str, who: str, source: str) -> None:
    """Raise a one-line :class:`DatasetUnavailableError` unless ``path`` has SHA-256 ``want``
    (``who`` starts the message, ``source`` names where the right file comes from)."""
    try:
        got = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise DatasetUnavailableError(f"{who}: cannot read {path}: {exc.strerror or exc}") from None
    if got != want:
        raise DatasetUnavailableError(
            f"{who}: {path} is corrupt (its SHA-256 is {got[:12]}..., {source}'s is "
            f"{want[:12]}...); delete it and run again to fetch it anew"
        )


def fetch_checked_members(
    package: str, version: str, prefix: str, members: dict[str, str], dest_subdir: str, who: str
) -> pathlib.Path:
    """Extract ``prefix + name`` for each ``name`` of ``members`` (name -> SHA-256) from the
    wheel of ``package==version`` into ``cache_dir()/dest_subdir``, check every file, and
    return the directory."""
    dest = fetch_wheel_member(package, version, [prefix + name for name in members], dest_subdir)
    for name, sha in members.items():
        check_sha256(dest / name, sha, who, f"{package} {version}")
    return dest


def movielens_100k() -> pathlib.Path:
    """Return the path of the cached MovieLens 100k ``ml-100k.inter``, fetching it if needed."""
    dest = fetch_wheel_member(
        _MOVIELENS_PACKAGE, _MOVIELENS_VERSION, [_MOVIELENS_MEMBER], "ml-100k"
    )
    return dest / posixpath.basename(_MOVIELENS_MEMBER)


def synthetic_ratings(
    path: pathlib.Path,
    *,
    n_users: int = 300,
    n_items: int = 500,
    n_ratings: int = 20000,
    rank: int = 5,
    seed: int = 0,
) -> pathlib.Path:
    """Write a MovieLens-like ``.inter`` file of low-rank ratings to ``path`` and return it."""
    if n_users < 1 or n_items < 1 or rank < 1:
        raise ValueError(
            f"n_users, n_items and rank must be >= 1, got {n_users}, {n_items} and {rank}"
        )
    if not 0 <= n_ratings <= n_users * n_items:
        raise ValueError(
            f"n_ratings must be between 0 and n_users * n_items = {n_users * n_items},"
            f" got {n_ratings}"
        )
    rng = np.random.default_rng(seed)
    users, items = _sample_pairs(rng, n_users, n_items, n_ratings)

    user_factors = rng.normal(size=(n_users, rank))
    item_factors = rng.normal(size=(n_items, rank))
    user_bias = rng.normal(scale=RATING_BIAS_STD, size=n_users)
    item_bias = rng.normal(scale=RATING_BIAS_STD, size=n_items)
    # Scaling by sqrt(rank) keeps the signal's spread independent of the rank.
    signal = np.einsum("ij,ij->i", user_factors[users], item_factors[items]) / math.sqrt(rank)
    noise = rng.normal(scale=RATING_NOISE_STD, size=n_ratings)
    raw = RATING_MEAN + RATING_SIGNAL_STD * signal + user_bias[users] + item_bias[items] + noise
    ratings = np.clip(np.rint(raw), 1, 5).astype(np.int64)
    timestamps = rng.integers(*TIMESTAMP_RANGE, endpoint=True, size=n_ratings)

    # MovieLens rows are not grouped by user, so neither are these.
    order = rng.permutation(n_ratings)
    rows = np.column_stack([users + 1, items + 1, ratings, timestamps])[order]
    lines = [RATINGS_HEADER, *("\t".join(map(str, row)) for row in rows.tolist())]
    payload = ("\n".join(lines) + "\n").encode()
    path = pathlib.Path(path)
    _atomic_write(path, payload)
    return path


def parse_rating_line(line: str) -> Rating:
    """Parse one data line of a ``.inter`` rating file into a 0-based ``Rating``."""
    fields = line.rstrip("\r\n").split("\t")
    if len(fields) != 4:
        raise ValueError(f"expected 4 tab-separated fields, got {len(fields)}")
    user = _parse_id("user", fields[0])
    item = _parse_id("item", fields[1])
    rating = parse_number("rating", fields[2])
    parse_number("timestamp", fields[3])
    return Rating(user, item, rating)


def _parse_id(kind: str, text: str) -> int:
    """Turn a 1-based id field into a 0-based index."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{kind} id {text!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{kind} id {value} is not positive (ids start at 1)")
    return value - 1


def parse_number(kind: str, text: str) -> float:
    """Parse a finite float field."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{kind} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{kind} {text!r} is not finite")
    return value


def _sample_pairs(
    rng: np.random.Generator, n_users: int, n_items: int, n_ratings: int
) -> tuple[np.ndarray, np.ndarray]:
    """Draw distinct 0-based (user, item) pairs with Zipf-like user and item frequencies."""
    user_weight = (np.arange(n_users) + USER_ACTIVITY_OFFSET) ** -USER_ACTIVITY_EXPONENT
    item_weight = (np.arange(n_items) + ITEM_POPULARITY_OFFSET) ** -ITEM_POPULARITY_EXPONENT

    # Ratings per user; a user cannot rate more items than exist, so the excess is dealt
    # again among users with room. Each round fills at least one user, so this ends.
    counts = rng.multinomial(n_ratings, user_weight / user_weight.sum())
    while (excess := int(np.maximum(counts - n_items, 0).sum())) > 0:
        counts = np.minimum(counts, n_items)
        room = np.where(counts < n_items, user_weight, 0.0)
        counts += rng.multinomial(excess, room / room.sum())

    # Efraimidis-Spirakis: the k smallest Exp(1) / weight keys are a weighted sample of k
    # items without replacement, which is what rules out duplicate pairs.
    users, items = [], []
    for user, count in enumerate(counts.tolist()):
        if count == 0:
            continue
        keys = rng.exponential(size=n_items) / item_weight
        chosen = np.argpartition(keys, count - 1)[:count] if count < n_items else np.arange(count)
        users.append(np.full(count, user))
        items.append(np.sort(chosen))
    if not users:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(users), np.concatenate(items)


#: Set to 1 by the ``replay`` CLI when a person watches (a terminal, no ``--json``).
PROGRESS_ENV_VAR = "STRADS_REPLAY_PROGRESS"


def show_progress() -> bool:
    """Whether a download shows a bar: the CLI asked for it and stderr is a terminal."""
    if os.environ.get(PROGRESS_ENV_VAR) != "1":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _pip_download(spec: str, tmp: pathlib.Path) -> pathlib.Path:
    """Download the wheel for ``spec`` into ``tmp`` with pip and return its path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--dest",
        str(tmp),
        spec,
    ]
    # a person at a terminal sees pip's own byte-counting bar (on stderr); pip's error
    # text is still captured for the one-line reason
    shown = show_progress()
    if shown:
        cmd[4:4] = ["--progress-bar", "on"]
    try:
        proc = subprocess.run(
            cmd,
            stdout=sys.stderr.fileno() if shown else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=PIP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise _unavailable(spec, f"pip download timed out after {PIP_TIMEOUT_S} s") from None
    except OSError as exc:
        raise _unavailable(spec, f"could not run pip ({exc})") from exc
    if proc.returncode != 0:
        raise _unavailable(
            spec, f"pip download exited with {proc.returncode}: {_pip_reason(proc.stderr)}"
        )
    wheels = sorted(tmp.glob("*.whl"))
    if not wheels:
        raise _unavailable(spec, "pip download produced no wheel")
    return wheels[0]


def _pip_reason(stderr: str | None) -> str:
    """Pick the most telling line of pip's stderr: its first error, else its first line."""
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["no error output"])[0]


def _unavailable(spec: str, what: str) -> DatasetUnavailableError:
    """Build the one-line error for a failed fetch of ``spec``."""
    return DatasetUnavailableError(f"cannot fetch {spec} from PyPI: {what}; {_FETCH_ADVICE}")


def _atomic_write(target: pathlib.Path, data: bytes) -> None:
    """Write ``target`` through a temporary sibling so it never exists half-written."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
    # os.open with mode 0o666 lets the umask decide permissions, as a plain open() would.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
