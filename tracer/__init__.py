"""Recording runs of the engine into a trace store, and reading traces back.

Typical use::

    import engine, tracer

    tracer.start_run("traces/x.sqlite", run_id, {"app": "sgdmf", "ranks": 2})
    rec = tracer.TraceRecorder("traces/x.sqlite", run_id, nodes=[0, 1], is_primary=True)
    engine.run(train, nodes=2, recorder=rec)
    rec.close("finished")

    with tracer.open("traces/x.sqlite") as trace:
        run = trace.run()
        print(run.operators(), run.objectives())
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from ._codec import CODECS as CODECS
    from ._errors import DriverMissingError as DriverMissingError
    from ._errors import RunExistsError as RunExistsError
    from ._errors import RunNotFoundError as RunNotFoundError
    from ._errors import TraceDamagedError as TraceDamagedError
    from ._errors import TraceFormatError as TraceFormatError
    from ._errors import TraceNotFoundError as TraceNotFoundError
    from ._errors import TracerError as TracerError
    from ._errors import TraceWriteError as TraceWriteError
    from ._events import EVENT_TYPES as EVENT_TYPES
    from ._events import DeltasAggregated as DeltasAggregated
    from ._events import DigestRecorded as DigestRecorded
    from ._events import Event as Event
    from ._events import IndexOrderDeviated as IndexOrderDeviated
    from ._events import InvocationCompleted as InvocationCompleted
    from ._events import LockGranted as LockGranted
    from ._events import MessageReceived as MessageReceived
    from ._events import MutexGranted as MutexGranted
    from ._events import ObjectiveLogged as ObjectiveLogged
    from ._events import PlanMade as PlanMade
    from ._events import RunEnded as RunEnded
    from ._events import UpdatesApplied as UpdatesApplied
    from ._export import ROUTED_NOTE as ROUTED_NOTE
    from ._export import export_chrome as export_chrome
    from ._plans import decode_plan as decode_plan
    from ._plans import encode_plan as encode_plan
    from ._read import CRASH_AFTER_S as CRASH_AFTER_S
    from ._read import RunInfo as RunInfo
    from ._read import Trace as Trace
    from ._read import WritableTrace as WritableTrace
    from ._read import open as open  # noqa: A004
    from ._read import open_writable as open_writable
    from ._recorder import TraceRecorder as TraceRecorder
    from ._run import InvocationInfo as InvocationInfo
    from ._run import LockGrantArrays as LockGrantArrays
    from ._run import MessageArrays as MessageArrays
    from ._run import MutexGrantArrays as MutexGrantArrays
    from ._run import OperatorSummary as OperatorSummary
    from ._run import RoutedCounts as RoutedCounts
    from ._run import RunTrace as RunTrace
    from ._run import VerdictInfo as VerdictInfo
    from ._schema import RUN_LIMITS as RUN_LIMITS
    from ._schema import SCHEMA_VERSION as SCHEMA_VERSION
    from ._store import create_store as create_store
    from ._store import describe as describe
    from ._store import is_url as is_url
    from ._store import mark_crashed as mark_crashed
    from ._store import probe_store as probe_store
    from ._store import special_kind as special_kind
    from ._store import sqlite_path as sqlite_path
    from ._store import start_run as start_run
    from ._text import printable as printable
    from ._verify import Problem as Problem
    from ._verify import Report as Report

#: Where each public name lives.  The package loads a module when one of its names is
#: first used (PEP 562), so that a process that only needs an error class or the event
#: types (an MPI rank that writes no trace) does not import SQLAlchemy (~0.4 s).
_HOME: dict[str, str] = {
    "CODECS": "._codec",
    "DriverMissingError": "._errors",
    "RunExistsError": "._errors",
    "RunNotFoundError": "._errors",
    "TraceDamagedError": "._errors",
    "TraceFormatError": "._errors",
    "TraceNotFoundError": "._errors",
    "TracerError": "._errors",
    "TraceWriteError": "._errors",
    "EVENT_TYPES": "._events",
    "DeltasAggregated": "._events",
    "DigestRecorded": "._events",
    "Event": "._events",
    "IndexOrderDeviated": "._events",
    "InvocationCompleted": "._events",
    "LockGranted": "._events",
    "MessageReceived": "._events",
    "MutexGranted": "._events",
    "ObjectiveLogged": "._events",
    "PlanMade": "._events",
    "RunEnded": "._events",
    "UpdatesApplied": "._events",
    "ROUTED_NOTE": "._export",
    "export_chrome": "._export",
    "decode_plan": "._plans",
    "encode_plan": "._plans",
    "CRASH_AFTER_S": "._read",
    "RunInfo": "._read",
    "Trace": "._read",
    "WritableTrace": "._read",
    "open": "._read",
    "open_writable": "._read",
    "TraceRecorder": "._recorder",
    "InvocationInfo": "._run",
    "LockGrantArrays": "._run",
    "MessageArrays": "._run",
    "MutexGrantArrays": "._run",
    "OperatorSummary": "._run",
    "RoutedCounts": "._run",
    "RunTrace": "._run",
    "VerdictInfo": "._run",
    "RUN_LIMITS": "._schema",
    "SCHEMA_VERSION": "._schema",
    "create_store": "._store",
    "describe": "._store",
    "is_url": "._store",
    "mark_crashed": "._store",
    "probe_store": "._store",
    "special_kind": "._store",
    "sqlite_path": "._store",
    "start_run": "._store",
    "printable": "._text",
    "Problem": "._verify",
    "Report": "._verify",
}


def __getattr__(name: str) -> _typing.Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


__all__ = [
    "CODECS",
    "CRASH_AFTER_S",
    "EVENT_TYPES",
    "RUN_LIMITS",
    "SCHEMA_VERSION",
    "ROUTED_NOTE",
    "DeltasAggregated",
    "DigestRecorded",
    "DriverMissingError",
    "Event",
    "IndexOrderDeviated",
    "InvocationCompleted",
    "InvocationInfo",
    "LockGrantArrays",
    "LockGranted",
    "MessageArrays",
    "RoutedCounts",
    "MessageReceived",
    "MutexGrantArrays",
    "MutexGranted",
    "ObjectiveLogged",
    "OperatorSummary",
    "PlanMade",
    "Problem",
    "Report",
    "RunEnded",
    "RunExistsError",
    "RunInfo",
    "RunNotFoundError",
    "RunTrace",
    "Trace",
    "TraceDamagedError",
    "TraceFormatError",
    "TraceNotFoundError",
    "TraceRecorder",
    "TraceWriteError",
    "TracerError",
    "UpdatesApplied",
    "VerdictInfo",
    "WritableTrace",
    "create_store",
    "decode_plan",
    "describe",
    "encode_plan",
    "export_chrome",
    "is_url",
    "mark_crashed",
    "open",
    "open_writable",
    "printable",
    "probe_store",
    "special_kind",
    "sqlite_path",
    "start_run",
]
