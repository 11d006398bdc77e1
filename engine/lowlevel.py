"""The engine's low-level face: what ``replay`` and ``tracer`` legitimately need.

This is a stable interface for the project's own record/replay and trace packages (and its
benchmarks), not for application authors: they use ``engine`` itself. It holds the plan
types and the plan builders the dual tests use, the schedule value of an invocation and the
pure machines that consume it (the lock turnstile, the grant-order codec, the SSP clock),
the layout of global element ids, the few steps the serial side of a ``sync_for`` dual test
needs to run bodies the way a worker does without touching the engine's private state, and
the benchmarks' baselines (the engine with a check off).
"""

from __future__ import annotations

from ._baseline import recon_cpu_times as recon_cpu_times
from ._baseline import without_closure_guard as without_closure_guard
from ._baseline import without_guard as without_guard
from ._control import Turnstile as Turnstile
from ._dds import SLOT_BITS as SLOT_BITS
from ._dds import SLOT_MASK as SLOT_MASK
from ._grants import GrantOrderError as GrantOrderError
from ._grants import decode_grant_order as decode_grant_order
from ._grants import encode_grant_order as encode_grant_order
from ._grants import merge_grant_order as merge_grant_order
from ._grants import recorded_ticket_order as recorded_ticket_order
from ._planner import Plan as Plan
from ._planner import Task as Task
from ._planner import serial_plan as serial_plan
from ._planner import wavefront_plan as wavefront_plan
from ._runtime import under_mpi_launcher as under_mpi_launcher
from ._schedule import GrantLog as GrantLog
from ._schedule import MutexLog as MutexLog
from ._schedule import Schedule as Schedule
from ._schedule import VisibilityLog as VisibilityLog
from ._schedule import serial_order as serial_order
from ._ssp import SspClock as SspClock
from ._syncdds import commit_rows as commit_rows
from ._syncdds import enter_sync_mode as enter_sync_mode
from ._syncdds import replica as replica
from ._syncdds import run_minibatch as run_minibatch
from ._syncdds import worker as worker
from ._syncfor import aggregation_of as aggregation_of

__all__ = [
    "SLOT_BITS",
    "SLOT_MASK",
    "GrantLog",
    "GrantOrderError",
    "MutexLog",
    "Plan",
    "Schedule",
    "VisibilityLog",
    "decode_grant_order",
    "encode_grant_order",
    "merge_grant_order",
    "serial_order",
    "SspClock",
    "Task",
    "Turnstile",
    "aggregation_of",
    "commit_rows",
    "enter_sync_mode",
    "replica",
    "recorded_ticket_order",
    "run_minibatch",
    "serial_plan",
    "under_mpi_launcher",
    "recon_cpu_times",
    "wavefront_plan",
    "without_closure_guard",
    "without_guard",
    "worker",
]
