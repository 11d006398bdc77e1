"""The STRADS-AP-style execution engine: distributed data structures and loop operators.

Typical use::

    import engine as ap

    W = ap.dvector(n_users, shape=(rank,), init=ap.init.normal(0, 0.1), name="W")
    ap.async_for(0, len(A), body, name="sgd")
"""

from __future__ import annotations

from ._asyncfor.kernel import BoundKernel as BoundKernel
from ._asyncfor.kernel import Kernel as Kernel
from ._asyncfor.kernel import index_rng as index_rng
from ._asyncfor.kernel import kernel as kernel
from ._asyncfor.loop import async_for as async_for
from ._asyncfor.loop import last_order as last_order
from ._asyncfor.loop import plan_of as plan_of
from ._asyncfor.recon import reconnaissance as reconnaissance
from ._data import init as init
from ._data.dds import dmap as dmap
from ._data.dds import dmultimap as dmultimap
from ._data.dds import dvector as dvector
from ._data.ops import create as create
from ._data.ops import evaluate as evaluate
from ._data.ops import join as join
from ._data.ops import load as load
from ._data.ops import map as map  # noqa: A004
from ._data.ops import reduce as reduce
from ._data.ops import store as store
from ._data.save import save as save
from ._errors import AccessOutsideReconError as AccessOutsideReconError
from ._errors import BodyError as BodyError
from ._errors import ClosureRuleError as ClosureRuleError
from ._errors import DataFormatError as DataFormatError
from ._errors import DDSError as DDSError
from ._errors import DivergenceError as DivergenceError
from ._errors import DriverCapturesDivergedError as DriverCapturesDivergedError
from ._errors import DriverDivergenceError as DriverDivergenceError
from ._errors import DriverStepsDivergedError as DriverStepsDivergedError
from ._errors import DriverWritesDivergedError as DriverWritesDivergedError
from ._errors import EngineError as EngineError
from ._errors import InputFileError as InputFileError
from ._errors import KernelError as KernelError
from ._errors import OutputPathError as OutputPathError
from ._errors import PeerRankFailed as PeerRankFailed
from ._errors import ReplicaMismatchError as ReplicaMismatchError
from ._errors import SaveError as SaveError
from ._errors import SessionError as SessionError
from ._errors import ShardMissError as ShardMissError
from ._errors import StaleDriverReadError as StaleDriverReadError
from ._errors import SyncProtocolError as SyncProtocolError
from ._machines.planner import Plan as Plan
from ._runtime.control import DebugHooks as DebugHooks
from ._runtime.control import ScheduleSource as ScheduleSource
from ._runtime.session import Recorder as Recorder
from ._runtime.session import RunResult as RunResult
from ._runtime.session import current as current
from ._runtime.session import log_objective as log_objective
from ._runtime.session import rng as rng
from ._runtime.session import run as run
from ._syncfor.dds import Batch as Batch
from ._syncfor.loop import register_aggregation as register_aggregation
from ._syncfor.loop import sync_for as sync_for

__all__ = [
    "AccessOutsideReconError",
    "Batch",
    "BodyError",
    "BoundKernel",
    "ClosureRuleError",
    "DDSError",
    "DataFormatError",
    "DebugHooks",
    "DivergenceError",
    "DriverCapturesDivergedError",
    "DriverDivergenceError",
    "DriverStepsDivergedError",
    "DriverWritesDivergedError",
    "EngineError",
    "InputFileError",
    "Kernel",
    "KernelError",
    "OutputPathError",
    "PeerRankFailed",
    "Plan",
    "Recorder",
    "ReplicaMismatchError",
    "RunResult",
    "SaveError",
    "ScheduleSource",
    "SessionError",
    "ShardMissError",
    "StaleDriverReadError",
    "SyncProtocolError",
    "async_for",
    "create",
    "current",
    "dmap",
    "dmultimap",
    "dvector",
    "evaluate",
    "index_rng",
    "init",
    "join",
    "kernel",
    "last_order",
    "load",
    "log_objective",
    "map",
    "plan_of",
    "reconnaissance",
    "reduce",
    "register_aggregation",
    "rng",
    "run",
    "save",
    "store",
    "sync_for",
]
