"""Baselines for the benchmarks: the engine with one of its checks switched off.

The benchmarks measure what a check costs by running the same program with and without it,
side by side in one process.  These switches are that "without"; a real run never uses them.
They substitute whole steps (mode classes, guard methods, the closure check) and put every
one back on leaving the block.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .._data import dds as _dds
from . import guard as _guard
from . import kernel as _kernel
from . import loop as _asyncfor


@contextmanager
def without_guard() -> Iterator[None]:
    """Run with the plan guard off: the DDS guard modes replaced by the plain exec modes,
    no per-round arming, no undo snapshot."""
    saved = {cls: dict(cls._modes) for cls in (_dds.dvector, _dds.dmap, _dds.dmultimap)}
    arm, prepare, init = _guard.Guard.arm, _guard.Guard.prepare, _guard.GuardPlan.__init__

    def no_undo(gp: Any, *a: Any) -> None:
        init(gp, *a)
        gp.undo_slots = []

    for cls, modes in saved.items():
        for tag in ("guard", "guard_t", "guard_ro"):
            cls._modes[tag] = modes["exec"]
            cls._modes[tag + "_obj"] = modes["exec_obj"]
            if "exec_shard" in modes:
                cls._modes[tag + "_shard"] = modes["exec_shard"]
    _guard.Guard.arm = lambda self, r, code=True: None  # type: ignore[method-assign]
    _guard.Guard.prepare = lambda self, sess, extra=None: None  # type: ignore[method-assign]
    _guard.GuardPlan.__init__ = no_undo  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        for cls, modes in saved.items():
            cls._modes.update(modes)
        _guard.Guard.arm, _guard.Guard.prepare = arm, prepare  # type: ignore[method-assign]
        _guard.GuardPlan.__init__ = init  # type: ignore[method-assign]


@contextmanager
def without_closure_guard() -> Iterator[None]:
    """Run ``async_for`` bodies bare, without the closure guard around them and without
    the normal run's comparison after each invocation (``closure.watch``)."""
    real, watch = _asyncfor.closure_guard, _asyncfor.closure_watch
    _asyncfor.closure_guard = lambda fn, *a, **kw: fn
    _asyncfor.closure_watch = lambda fn, *a, **kw: None
    try:
        yield
    finally:
        _asyncfor.closure_guard, _asyncfor.closure_watch = real, watch


@contextmanager
def recon_cpu_times() -> Iterator[list[float]]:
    """Collect the CPU seconds of every reconnaissance call of ``async_for`` in the block."""
    real: Callable[..., Any] = _asyncfor.recon_range
    spent: list[float] = []

    def timed(*a: Any, **kw: Any) -> Any:
        t = time.process_time()
        try:
            return real(*a, **kw)
        finally:
            spent.append(time.process_time() - t)

    _asyncfor.recon_range = timed
    try:
        yield spent
    finally:
        _asyncfor.recon_range = real


@contextmanager
def python_kernel_recon() -> Iterator[None]:
    """Reconnaissance of kernels as before it was compiled: the kernel's Python function
    on every body, through the DDS reconnaissance mode."""
    real = _kernel.COMPILED_RECON
    _kernel.COMPILED_RECON = False
    try:
        yield
    finally:
        _kernel.COMPILED_RECON = real


__all__ = ["python_kernel_recon", "recon_cpu_times", "without_closure_guard", "without_guard"]
