"""What replay may run: the user's own function, unchanged, with well-typed parameters.

A trace is data written by whoever recorded it.  Its run row names a target
(``module:function`` or ``path/to/file.py:function``), parameters and the blake2b
digest of the target's source file.  Replaying runs *the user's* program at that
target, so before anything runs:

* the target must be a module file or an importable module of this machine, found
  without executing any of it (no parent package, no path from the trace on
  ``sys.path``), and not part of the Python standard library;
* a target the *trace* names (the user named none) must moreover be the user's own
  source: a file outside every library path of this interpreter (standard library,
  site-packages, dist-packages, the user site, and this product's own packages), so a
  forged run row cannot point replay at an installed library function that runs a
  command (``numpy.distutils.lib2def:getnm``, pip's CLI);
* its source file must have the recorded digest (``--allow-changed-code`` waives this);
* once imported, the target must be a Python function defined in a ``.py`` file — not a
  builtin, a C function, a class, a lambda or a standard-library function;
* the recorded parameters must be a mapping of the function's own parameter names to
  values of their annotated types.

Each refusal is a :class:`UsageError` (one line, exit 2).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import inspect
import os
import site
import sys
import sysconfig
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._errors import UsageError

#: Hex digits of a digest shown in messages: enough to tell two files apart by eye.
SHORT_DIGEST = 12


class CodeChangedError(UsageError):
    """The target's source file is not the one the trace was recorded with."""


def file_digest(path: str | os.PathLike[str]) -> str:
    """blake2b (16 bytes) of a file, as ``code_digest`` records it."""
    return hashlib.blake2b(Path(path).read_bytes(), digest_size=16).hexdigest()


def _stdlib_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(paths[k]).resolve() for k in ("stdlib", "platstdlib") if k in paths]


def _in_stdlib(path: Path) -> bool:
    p = path.resolve()
    site = [d for d in ("site-packages", "dist-packages") if d in p.parts]
    return not site and any(p.is_relative_to(d) for d in _stdlib_dirs())


def library_dirs() -> list[Path]:
    """Every directory this interpreter installs or ships library code in."""
    paths = sysconfig.get_paths()
    dirs = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # a virtualenv's old site module
        pass
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if isinstance(user, str):
        dirs.append(user)
    # this product's own packages, wherever they are installed (an editable install too)
    here = Path(__file__).resolve().parent.parent
    dirs += [str(here / pkg) for pkg in ("engine", "tracer", "replay", "tui", "apps")]
    return [Path(d).resolve() for d in dict.fromkeys(dirs)]


def in_library(path: Path) -> bool:
    """Whether ``path`` lies in a library directory (see :func:`library_dirs`)."""
    p = path.resolve()
    if "site-packages" in p.parts or "dist-packages" in p.parts:
        return True
    return any(p.is_relative_to(d) for d in library_dirs())


def own_source(target: str) -> Path:
    """The file of a target the trace names, if it is the user's own source file."""
    path = target_file(target)
    if in_library(path):
        raise UsageError(
            f"the trace names {target!r}, which is library code ({path}), not a training "
            "function of yours; replay runs a trace's own target only from your source files"
        )
    return path


def module_file(name: str) -> Path:
    """The ``.py`` file of importable module ``name``, found without executing anything."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        raise UsageError(f"{name!r} is not a module name")
    if parts[0] in sys.builtin_module_names:
        raise UsageError(
            f"module {name!r} is built into Python (C code, no .py file); "
            "replay runs only functions in .py files"
        )
    search: list[str] | None = None
    spec = None
    for k in range(len(parts)):
        full = ".".join(parts[: k + 1])
        # the bare name: a dotted one makes a namespace package look its parent up in
        # sys.modules, which holds nothing here because nothing is imported
        try:
            spec = importlib.machinery.PathFinder.find_spec(parts[k], search)
        except (ImportError, KeyError, ValueError) as exc:
            raise UsageError(f"module {full!r} cannot be located: {exc}") from None
        if spec is None:
            raise UsageError(f"module {name!r} is not importable on this machine")
        if k < len(parts) - 1:
            if spec.submodule_search_locations is None:
                raise UsageError(f"module {full!r} is not a package, so {name!r} does not exist")
            search = list(spec.submodule_search_locations)
    assert spec is not None
    origin = spec.origin
    if not origin or not origin.endswith(".py") or not Path(origin).is_file():
        raise UsageError(
            f"module {name!r} is not a Python source file ({origin or 'no file'}); "
            "replay runs only functions in .py files"
        )
    return Path(origin)


def target_file(target: str) -> Path:
    """The source file a ``where:function`` target names (nothing is executed)."""
    if ":" not in target:
        raise UsageError(
            f"target {target!r} is not of the form module:function or file.py:function"
        )
    where = target.rsplit(":", 1)[0]
    if where.endswith(".py") or "/" in where or os.sep in where:
        path = Path(where).expanduser()
        if path.suffix != ".py":
            raise UsageError(f"app file {where!r} is not a .py file")
        if not path.is_file():
            raise UsageError(f"app file {where!r} does not exist")
        path = path.resolve()
    else:
        path = module_file(where)
    if _in_stdlib(path):
        raise UsageError(
            f"target {target!r} is in the Python standard library ({path}); "
            "replay runs only your own training functions"
        )
    return path


def _kind(fn: Any) -> str:
    if inspect.isclass(fn):
        return "a class"
    if inspect.isbuiltin(fn) or type(fn).__name__ in ("builtin_function_or_method", "method"):
        return "a builtin or C function"
    if inspect.isfunction(fn) and fn.__name__ == "<lambda>":
        return "a lambda"
    if inspect.isfunction(fn):
        return f"a function defined in {fn.__code__.co_filename}"
    return f"a {type(fn).__name__} object"


def check_function(fn: Any, target: str) -> None:
    """Refuse anything but a named Python function defined in an existing ``.py`` file."""
    ok = inspect.isfunction(fn) and fn.__name__ != "<lambda>"
    if ok:
        src = fn.__code__.co_filename
        ok = src.endswith(".py") and os.path.isfile(src) and not _in_stdlib(Path(src))
    if not ok:
        raise UsageError(
            f"target {target!r} is {_kind(fn)}, not a training function defined in your own "
            ".py file; replay and run call only such functions"
        )


def check_digest(recorded: str, current: str, where: str, *, allow_changed: bool) -> None:
    """Raise :class:`CodeChangedError` unless the digests agree or ``allow_changed``."""
    if allow_changed or (recorded and recorded == current):
        return
    rec = recorded[:SHORT_DIGEST] if recorded else "none"
    raise CodeChangedError(
        f"the code at {where} is not the code the trace was recorded with "
        f"(digest {rec} recorded, {current[:SHORT_DIGEST]} now); "
        "replay it anyway with --allow-changed-code to see where it diverges"
    )


def _matches(value: Any, kind: Any) -> bool:
    if kind in (inspect.Parameter.empty, Any, object):
        return isinstance(value, (int, float, str, bool, type(None)))
    if kind is None or kind is type(None):
        return value is None
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, k) for k in typing.get_args(kind))
    if origin is typing.Literal:
        return value in typing.get_args(kind)
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(kind, type):
        return isinstance(value, kind)
    return False  # an annotation replay cannot check: refuse rather than guess


def check_params(fn: Callable[..., Any], params: Any, target: str) -> dict[str, Any]:
    """The recorded ``params`` if they fit ``fn``'s signature and annotations."""
    if not isinstance(params, dict):
        raise UsageError(
            f"the trace's parameters for {target!r} are a {type(params).__name__}, "
            "not a mapping of names to values; the trace is damaged or forged"
        )
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations: judge by the defaults
        hints = {}
    for name, value in params.items():
        p = sig.parameters.get(name) if isinstance(name, str) else None
        if p is None or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            known = ", ".join(sig.parameters) or "none"
            raise UsageError(
                f"the trace passes parameter {name!r} that {target!r} does not take "
                f"(it takes: {known})"
            )
        kind = hints.get(name, p.annotation)
        if kind is inspect.Parameter.empty and p.default not in (inspect.Parameter.empty, None):
            kind = type(p.default)
        if not _matches(value, kind):
            want = getattr(kind, "__name__", None) or str(kind)
            raise UsageError(
                f"the trace passes {name}={value!r} ({type(value).__name__}) to {target!r}, "
                f"which declares {name}: {want}"
            )
    return dict(params)


__all__ = [
    "CodeChangedError",
    "check_digest",
    "check_function",
    "check_params",
    "file_digest",
    "in_library",
    "library_dirs",
    "module_file",
    "own_source",
    "target_file",
]
