"""The engine's low-level face: what ``replay`` and ``tracer`` legitimately need.

This is a stable interface for the project's own record/replay and trace packages (and its
benchmarks), not for application authors: they use ``engine`` itself. It holds the plan
types and the plan builders the dual tests use, the schedule value of an invocation and the
pure machines that consume it (the lock turnstile, the grant-order codec, the SSP clock),
the layout of global element ids, and the benchmarks' baselines (the engine with a check off).
"""

from __future__ import annotations

from ._asyncfor.baseline import python_kernel_recon as python_kernel_recon
from ._asyncfor.baseline import recon_cpu_times as recon_cpu_times
from ._asyncfor.baseline import without_closure_guard as without_closure_guard
from ._asyncfor.baseline import without_guard as without_guard
from ._data.dds import SLOT_BITS as SLOT_BITS
from ._data.dds import SLOT_MASK as SLOT_MASK
from ._data.dds import available_memory as available_memory
from ._data.dds import homes as homes
from ._data.digest import NAMES as DIGEST_NAMES
from ._data.digest import DigestKindError as DigestKindError
from ._data.digest import check_same_kind as check_same_digest_kind
from ._data.digest import kind_of as digest_kind_of
from ._data.relaxed import rows_seen as rows_seen
from ._data.save import model_format as model_format
from ._data.save import text_word_problem as text_word_problem
from ._data.save import write_model as write_model
from ._data.values import TEXT_VERSION as OBJECT_TEXT_VERSION
from ._data.values import stable_text as stable_text
from ._errors import ScheduleExhausted as ScheduleExhausted
from ._files import SIDECARS as SQLITE_SIDECARS
from ._files import check_target as check_output_path
from ._files import check_writable as check_writable
from ._files import grew as input_grew
from ._files import open_input as open_input
from ._files import replacing as replacing
from ._files import write_file as write_file
from ._machines.chaos import FAULT as FAULT
from ._machines.chaos import Chaos as Chaos
from ._machines.grants import GrantOrderError as GrantOrderError
from ._machines.grants import decode_grant_order as decode_grant_order
from ._machines.grants import encode_grant_order as encode_grant_order
from ._machines.grants import merge_grant_order as merge_grant_order
from ._machines.grants import recorded_ticket_order as recorded_ticket_order
from ._machines.messages import MessageLog as MessageLog
from ._machines.messages import MessageOrder as MessageOrder
from ._machines.planner import Plan as Plan
from ._machines.planner import Task as Task
from ._machines.planner import serial_plan as serial_plan
from ._machines.planner import wavefront_plan as wavefront_plan
from ._machines.planparts import node_bytes as plan_node_bytes
from ._machines.planparts import plan_digest as plan_digest
from ._machines.routing import held_touches as held_touches
from ._machines.schedule import GrantLog as GrantLog
from ._machines.schedule import MutexLog as MutexLog
from ._machines.schedule import Schedule as Schedule
from ._machines.schedule import VisibilityLog as VisibilityLog
from ._machines.schedule import serial_order as serial_order
from ._machines.ssp import SspClock as SspClock
from ._machines.tape import Tape as Tape
from ._machines.tape import emit as emit_events
from ._machines.turnstile import Turnstile as Turnstile
from ._runtime.checkpoint import dds_contents as dds_contents
from ._runtime.checkpoint import find_dds as find_dds
from ._runtime.checkpoint import local_owned_rows as local_owned_rows
from ._runtime.session import inspecting as inspecting
from ._runtime.transport import under_mpi_launcher as under_mpi_launcher

__all__ = [
    "DIGEST_NAMES",
    "rows_seen",
    "available_memory",
    "OBJECT_TEXT_VERSION",
    "Chaos",
    "DigestKindError",
    "check_same_digest_kind",
    "check_output_path",
    "check_writable",
    "digest_kind_of",
    "FAULT",
    "SLOT_BITS",
    "SLOT_MASK",
    "SQLITE_SIDECARS",
    "GrantLog",
    "MessageLog",
    "MessageOrder",
    "GrantOrderError",
    "MutexLog",
    "Plan",
    "plan_digest",
    "plan_node_bytes",
    "held_touches",
    "homes",
    "Schedule",
    "Tape",
    "ScheduleExhausted",
    "VisibilityLog",
    "decode_grant_order",
    "emit_events",
    "encode_grant_order",
    "merge_grant_order",
    "model_format",
    "serial_order",
    "SspClock",
    "Task",
    "Turnstile",
    "dds_contents",
    "local_owned_rows",
    "find_dds",
    "input_grew",
    "inspecting",
    "open_input",
    "replacing",
    "write_file",
    "write_model",
    "text_word_problem",
    "recorded_ticket_order",
    "serial_plan",
    "stable_text",
    "under_mpi_launcher",
    "python_kernel_recon",
    "recon_cpu_times",
    "wavefront_plan",
    "without_closure_guard",
    "without_guard",
]
