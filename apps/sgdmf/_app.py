"""SGD matrix factorisation: the sequential loop, made parallel with ``async_for``.

The only changes from the serial program are that the rating list and the factor
matrices are DDS and the inner loop is an ``async_for``.  Each body touches one row of
``W`` and one of ``H``, so the planner picks block rotation (the DSGD ring).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import engine as ap

from .._datasets import (
    BOM,
    RATINGS_HEADER,
    Rating,
    cache_dir,
    movielens_100k,
    parse_rating_line,
    synthetic_ratings,
    writing_cache,
)
from .._errors import AppError
from .._params import require_finite

#: What ``replay run --save`` writes and ``replay export --model`` reads back from a
#: checkpoint: saved array name -> the DDS it is (the rest of ``train``'s ``model`` entry
#: is data the trace does not hold).
MODEL_DDS = {"W": "W", "H": "H"}
#: Parameters added or changed after traces were recorded, with the value that runs as
#: such a trace ran (``replay._apps.recorded_params``): a trace without ``kernel`` ran
#: the Python body, which was the default until 2026-12-07.
ADDED_PARAMS = {"kernel": False}
#: Synthetic data shape for ``-p synthetic=true`` (tests and offline use).
SYNTHETIC_SHAPE = {"n_users": 300, "n_items": 500, "n_ratings": 20000}


def parse_line(line: str) -> Rating | None:
    """Parse one line of a ``.inter`` rating file; ``None`` for the header and blank lines."""
    line = line.removeprefix(BOM)  # the first line's byte order mark, if an editor wrote one
    if not line.strip() or line == RATINGS_HEADER or line.startswith("user_id"):
        return None
    return parse_rating_line(line)


def data_path(
    data: str = "", synthetic: bool = False, seed: int = 0, ratings: int | None = None
) -> Path:
    """The rating file to train on: ``data`` if given, generated data (``ratings`` of
    them, default ``SYNTHETIC_SHAPE``'s), or MovieLens-100K."""
    if data:
        return Path(data)
    if synthetic:
        shape = dict(SYNTHETIC_SHAPE)
        if ratings is not None:
            most = shape["n_users"] * shape["n_items"]
            if not 1 <= ratings <= most:
                raise AppError(
                    f"sgdmf: synthetic_ratings must be between 1 and {most} (got {ratings})"
                )
            shape["n_ratings"] = ratings
        name = f"synthetic-{shape['n_users']}x{shape['n_items']}-{shape['n_ratings']}-s{seed}.inter"
        path = cache_dir() / "synthetic" / name
        if not path.exists():
            with writing_cache():
                path.parent.mkdir(parents=True, exist_ok=True)
                synthetic_ratings(path, seed=seed, **shape)
        return path
    return movielens_100k()


def prefetch(synthetic: bool = False, data: str = "", **_: Any) -> None:
    """Fetch the data set :func:`train` will read, in the calling process (``replay run``
    calls it before it starts MPI ranks, so a first download can show its progress)."""
    if not data and not synthetic:
        movielens_100k()


def rmse(A: ap.dvector, W: ap.dvector, H: ap.dvector) -> float:
    """Root-mean-square training error, built from ``ap.reduce`` (identical on any cluster)."""
    sq = ap.reduce(A, lambda r: (r.rating - W[r.user] @ H[r.item]) ** 2)
    return math.sqrt(sq / len(A))


def build(
    rank: int,
    init_std: float,
    synthetic: bool = False,
    data: str = "",
    synthetic_ratings: int | None = None,
) -> tuple[ap.dvector, ap.dvector, ap.dvector]:
    """Load the ratings and create the factor matrices: (A, W, H)."""
    A, _, W, H = build_split(rank, init_std, synthetic, data, synthetic_ratings)
    return A, W, H


def held_out(line: str, salt: bytes, holdout: float) -> bool:
    """Whether the rating on ``line`` is held out: a keyed hash of the line, so the choice
    depends on the salt (drawn from the run's seed) and the rating, not on where the line
    is or which rank reads it."""
    h = hashlib.blake2b(line.encode(), key=salt, digest_size=8).digest()
    return int.from_bytes(h, "little") < holdout * 2.0**64


def build_split(
    rank: int,
    init_std: float,
    synthetic: bool = False,
    data: str = "",
    synthetic_ratings: int | None = None,
    *,
    holdout: float = 0.0,
    test: str = "",
) -> tuple[ap.dvector, ap.dvector | None, ap.dvector, ap.dvector]:
    """Load the training ratings, the test ratings (``test``'s file, a share ``holdout``
    of the ratings chosen from the run's seed, or None) and create the factor matrices:
    (A, T, W, H).  W and H have a row for every id in either set."""
    path = data_path(data, synthetic, ratings=synthetic_ratings)
    T = None
    if holdout > 0.0:
        salt = ap.rng().bytes(16)  # the driver's stream: the same on every rank and replay

        def train_line(line: str) -> object:
            return None if held_out(line, salt, holdout) else parse_line(line)

        def test_line(line: str) -> object:
            return parse_line(line) if held_out(line, salt, holdout) else None

        A = ap.load(path, parse=train_line, name="ratings")
        T = ap.load(path, parse=test_line, name="test_ratings")
    else:
        A = ap.load(path, parse=parse_line, name="ratings")
        if test:
            T = ap.load(test, parse=parse_line, name="test_ratings")
    if len(A) == 0:
        raise AppError("sgdmf: the rating file has no ratings")
    if T is not None and len(T) == 0:
        what = f"the test file {test!r} has" if test else f"holdout={holdout} left"
        raise AppError(f"sgdmf: {what} no ratings to test on")
    n_users = ap.reduce(A, lambda r: r.user, op=max) + 1
    n_items = ap.reduce(A, lambda r: r.item, op=max) + 1
    if T is not None:  # a test id never trained keeps its initial row (a cold start)
        n_users = max(n_users, ap.reduce(T, lambda r: r.user, op=max) + 1)
        n_items = max(n_items, ap.reduce(T, lambda r: r.item, op=max) + 1)
    mean = ap.reduce(A, lambda r: r.rating) / len(A)
    # start every prediction near the global mean so SGD only learns the residual
    center = math.sqrt(mean / rank)
    W = ap.dvector(n_users, shape=(rank,), init=ap.init.normal(center, init_std), name="W")
    H = ap.dvector(n_items, shape=(rank,), init=ap.init.normal(center, init_std), name="H")
    return A, T, W, H


def epoch(
    A: ap.dvector, W: ap.dvector, H: ap.dvector, g: float, lam: float, *, strategy: str = "auto"
) -> None:
    """One SGD pass over every rating (one ``async_for`` invocation named ``sgd``, planned
    with the planner's ``strategy``)."""

    def body(j: int) -> None:
        r = A[j]
        w = W[r.user]
        h = H[r.item]
        err = r.rating - w @ h
        W[r.user] = w + g * (err * h - lam * w)
        H[r.item] = h + g * (err * w - lam * h)

    ap.async_for(0, len(A), body, name="sgd", strategy=strategy)


@ap.kernel
def sgd_kernel(j: int, R: Any, W: Any, H: Any, g: float, lam: float) -> None:
    """The body of :func:`epoch` as a compiled kernel: ``R[j]`` is (user, item, rating)."""
    r = R[j]
    u = int(r[0])
    i = int(r[1])
    w = W[u]
    h = H[i]
    err = r[2] - w @ h
    W[u] = w + g * (err * h - lam * w)
    H[i] = h + g * (err * w - lam * h)


def numeric_ratings(A: ap.dvector) -> ap.dvector:
    """The ratings as a dvector of (user, item, rating) rows, what a kernel can index."""
    R = ap.map(A, lambda r: (r.user, r.item, r.rating), shape=(3,), name="ratings3")
    assert isinstance(R, ap.dvector)  # ap.map keeps the container kind
    return R


def _errors(r: np.ndarray, w: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Each rating's training error, as :func:`rmse`'s ``ap.reduce`` computes it."""
    out = np.empty(r.shape[0])
    for j in range(r.shape[0]):
        out[j] = r[j, 2] - w[int(r[j, 0])] @ h[int(r[j, 1])]
    return out


def _fold(values: np.ndarray) -> float:
    """``values`` summed in index order: :func:`rmse`'s ``ap.reduce`` as it was before
    its exact sum (a replay of a run recorded then folds so)."""
    acc = 0.0
    for j in range(values.shape[0]):
        acc += values[j]
    return acc


def _squares(e: np.ndarray) -> np.ndarray:
    """``e ** 2`` element by element as :func:`rmse` squares one error, a numpy float64:
    with libm's ``pow``, which is not ``e * e`` to the bit (about 1 in 1 000 values of
    1e9 differ by an ulp; numba and numpy's array ``** 2`` multiply).  An array exponent
    makes numpy call ``pow`` for each element, as it does for one scalar."""
    return np.power(e, np.full_like(e, 2.0))


@functools.cache
def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled, on first use: numba is imported only by the kernel version, so
    the Python app runs where numba cannot be imported."""
    import numba

    compiled: Callable[..., Any] = numba.njit(cache=True)(fn)
    return compiled


def _exact_sum(sq: np.ndarray) -> float:
    """The correctly rounded sum of values that are >= 0, +inf or NaN: ``ap.reduce``'s
    exact sum of them (``math.fsum`` only gives up on an intermediate overflow, and a sum
    of values >= 0 that overflows on the way rounds to infinity)."""
    try:
        return math.fsum(sq.tolist())
    except OverflowError:
        return math.inf


def _rmse_of(ratings: np.ndarray, w: np.ndarray, h: np.ndarray, exact: bool) -> float:
    squares = _squares(_compiled(_errors)(ratings, w, h))
    total = _exact_sum(squares) if exact else _compiled(_fold)(squares)
    return math.sqrt(total / len(ratings))


def rmse_compiled(ratings: np.ndarray, W: ap.dvector, H: ap.dvector) -> float:
    """:func:`rmse` over the (user, item, rating) rows, compiled (collective: the trace
    holds the value, not W and H)."""
    return float(ap.evaluate(_rmse_of, ratings, W, H, ap.current().exact_reduce))


def _need_numba() -> None:
    """Stop before any data is read when the compiled body cannot run here."""
    try:
        import numba  # noqa: F401
    except ImportError as exc:  # a broken install: numba is a dependency
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise AppError(
            f"sgdmf: the compiled body (kernel=true, the default) needs numba, which cannot "
            f"be imported ({why}); repair the install (pip install numba), or run the Python "
            "body: -p kernel=false"
        ) from None


def kernel_epoch(R: ap.dvector, W: ap.dvector, H: ap.dvector, g: float, lam: float) -> None:
    """:func:`epoch` with the compiled body (the same arithmetic, bit for bit)."""
    ap.async_for(0, len(R), sgd_kernel.bind(R, W, H, g, lam), name="sgd")


def train(
    epochs: int = 10,
    rank: int = 32,
    gamma: float = 0.02,
    decay: float = 0.95,
    lam: float = 0.05,
    init_std: float = 0.1,
    synthetic: bool = False,
    data: str = "",
    kernel: bool = True,
    synthetic_ratings: int = SYNTHETIC_SHAPE["n_ratings"],
    holdout: float = 0.0,
    test: str = "",
) -> dict[str, Any]:
    """Factorise the rating matrix; logs training ``rmse`` after every epoch, and
    ``test_rmse`` on held-out ratings when there are some.

    ``kernel=True`` (the default) runs the loop body as a compiled kernel
    (:func:`sgd_kernel`: the same arithmetic, bit for bit, about 40 times faster per
    epoch); ``kernel=False`` runs the Python body of :func:`epoch`, which needs no numba;
    ``synthetic_ratings`` is how many ratings ``synthetic=true`` generates (a quick
    offline try, or a fast test).  ``holdout`` is the share of the ratings held out of
    training (chosen from the run's seed), ``test`` a rating file to test on instead;
    both are off by default, so a trace recorded before they existed replays with the
    same data."""
    require_finite("sgdmf", gamma=gamma, decay=decay, lam=lam, init_std=init_std, holdout=holdout)
    if epochs < 0 or rank < 1 or gamma <= 0 or decay <= 0 or lam < 0 or init_std < 0:
        raise AppError(
            "sgdmf: need epochs >= 0, rank >= 1, gamma > 0, decay > 0, lam >= 0, init_std >= 0"
            f" (got {epochs}, {rank}, {gamma}, {decay}, {lam}, {init_std})"
        )
    if not 0.0 <= holdout < 1.0:
        raise AppError(f"sgdmf: need 0 <= holdout < 1 (got {holdout})")
    if holdout and test:
        raise AppError("sgdmf: give holdout or test, not both")
    if kernel:
        _need_numba()
    A, T, W, H = build_split(
        rank, init_std, synthetic, data, synthetic_ratings, holdout=holdout, test=test
    )
    R = numeric_ratings(A) if kernel else None
    ratings = R.gather() if R is not None else None
    tests = None
    if T is not None and kernel:
        tests = np.array([(r.user, r.item, r.rating) for r in T.gather()], dtype=np.float64)
    g = gamma
    for _ in range(epochs):
        if R is not None and ratings is not None:
            kernel_epoch(R, W, H, g, lam)
            ap.log_objective("rmse", rmse_compiled(ratings, W, H))
            if tests is not None:
                ap.log_objective("test_rmse", rmse_compiled(tests, W, H))
        else:
            epoch(A, W, H, g, lam)
            ap.log_objective("rmse", rmse(A, W, H))
            if T is not None:
                ap.log_objective("test_rmse", rmse(T, W, H))
        g *= decay
    held = {} if T is None else {"test_ratings": len(T)}
    return {
        "users": len(W),
        "items": len(H),
        "ratings": len(A),
        **held,
        "model": {"W": W, "H": H},
    }
