"""Finding an app (a built-in name, ``file.py:function`` or ``module:function``) and
converting ``-p NAME=VALUE`` strings with the function's type annotations."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import UsageError
from ._target import check_function, target_file

#: Built-in apps: name -> "module:function".
BUILTIN_APPS = {
    "sgdmf": "apps.sgdmf:train",
    "mlr": "apps.mlr:train",
    "transe": "apps.transe:train",
    "lasso": "apps.lasso:train",
    "word2vec": "apps.word2vec:train",
    "lda": "apps.lda:train",
}


@dataclass(frozen=True)
class App:
    """A resolved app: what the user typed, where it lives, and the function."""

    spec: str
    target: str
    fn: Callable[..., Any]

    @property
    def name(self) -> str:
        """Short name for messages and trace file names."""
        if self.spec in BUILTIN_APPS:
            return self.spec
        return self.target.rsplit(":", 1)[-1]


def _load_file(path: Path) -> Any:
    """The module of the user's file ``path``, imported once per content: a process that
    lives on (the browser, in-process commands) runs the file as it is now, not as it
    was when it first imported it, under the name every process gives that content."""
    h = hashlib.blake2b(str(path).encode(), digest_size=6)
    try:
        source = path.read_bytes()
        h.update(source)
    except OSError as exc:
        raise UsageError(f"cannot read {str(path)!r}: {exc.strerror}") from None
    mod_name = "replay_user_" + h.hexdigest()
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {str(path)!r} as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    sys.path.insert(0, str(path.parent))
    try:
        # compiled from the bytes just hashed, never from __pycache__: a file rewritten
        # within its mtime's resolution at the same size kept its old bytecode, so the
        # process ran the code the file held before (and replay compared against it)
        exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the user's app
    except Exception as exc:
        del sys.modules[mod_name]
        raise UsageError(f"importing {str(path)!r} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(str(path.parent))
    return module


def resolve(spec: str) -> App:
    """Turn an APP argument into an :class:`App` or raise :class:`UsageError`."""
    target = BUILTIN_APPS.get(spec, spec)
    if ":" not in target:
        names = ", ".join(sorted(BUILTIN_APPS))
        raise UsageError(
            f"unknown app {spec!r}: use a built-in app ({names}) or path/to/train.py:function"
        )
    where, func = target.rsplit(":", 1)
    if spec not in BUILTIN_APPS:
        # where the code is, found without running any of it (stdlib, C modules refused)
        path = target_file(target)
    if where.endswith(".py") or "/" in where or os.sep in where:
        module = _load_file(path)
        target = f"{path}:{func}"
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise UsageError(f"cannot import module {where!r} for app {spec!r}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - the user's module failed on import
            raise UsageError(f"importing {where!r} failed: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, func, None)
    if fn is None:
        raise UsageError(f"{where!r} has no function {func!r}")
    check_function(fn, target)
    return App(spec, target, fn)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(name: str, raw: str, kind: Any) -> Any:
    if kind is bool:
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise UsageError(f"parameter {name}: {raw!r} is not a boolean (use true or false)")
    if kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise UsageError(f"parameter {name}: {raw!r} is not {what}") from None
    if kind in (str, inspect.Parameter.empty, Any):
        return raw
    raise UsageError(f"parameter {name}: cannot convert from the command line to {kind!r}")


def parse_params(fn: Callable[..., Any], pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """Convert ``NAME=VALUE`` strings using ``fn``'s annotations (int, float, bool, str)."""
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations fall back to str
        hints = {}
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UsageError(f"-p expects NAME=VALUE, got {pair!r}")
        name, raw = pair.split("=", 1)
        name = name.strip()
        if name not in sig.parameters:
            known = ", ".join(sig.parameters) or "none"
            raise UsageError(f"unknown parameter {name!r}; this app takes: {known}")
        param = sig.parameters[name]
        kind = hints.get(name, param.annotation)
        if kind is inspect.Parameter.empty and param.default is not inspect.Parameter.empty:
            kind = type(param.default)
        out[name] = _convert(name, raw, kind)
    return out


def all_params(fn: Callable[..., Any], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` completed with the defaults of ``fn`` (what the run really used)."""
    out = {}
    for name, p in inspect.signature(fn).parameters.items():
        if name in given:
            out[name] = given[name]
        elif p.default is not inspect.Parameter.empty:
            out[name] = p.default
    return out


def recorded_params(fn: Callable[..., Any], params: dict[str, Any]) -> dict[str, Any]:
    """The parameters to run a recorded run of ``fn`` again with (replay, time travel,
    resume): ``params`` as the trace holds them, plus each parameter ``fn`` gained after
    the run was recorded, set to the value that behaves as ``fn`` did before it existed.

    A trace records every parameter with the default of its day (:func:`all_params`), so
    one it lacks was added later; today's default may choose other data or another
    schedule (a replay would then diverge, or a resume continue a different run).  The
    app's module names those values in ``ADDED_PARAMS`` (name -> value); a missing one
    falls back to today's default, as before."""
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    added = getattr(module, "ADDED_PARAMS", None)
    out = dict(params)
    if isinstance(added, dict):
        for name, value in added.items():
            out.setdefault(name, value)
    return out


__all__ = ["BUILTIN_APPS", "App", "all_params", "parse_params", "recorded_params", "resolve"]
