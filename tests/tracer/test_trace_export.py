"""Chrome trace-event export, checked against the Trace Event Format at schema level."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import tracer
from tracer._export import NODE_TID

sys.path.insert(0, str(Path(__file__).parent))
from chromeformat import problems  # noqa: E402


def load(recorded_trace: Path, tmp_path: Path) -> dict:
    out = tmp_path / "run.json"
    with tracer.open(recorded_trace) as trace:
        n = tracer.export_chrome(trace, None, out)
    doc = json.loads(out.read_text())  # valid JSON
    assert len(doc["traceEvents"]) == n
    return doc


def test_events_follow_the_trace_event_format(recorded_trace: Path, tmp_path: Path) -> None:
    doc = load(recorded_trace, tmp_path)
    assert doc["displayTimeUnit"] == "ms"
    assert problems(doc) == []
    phases = {e["ph"] for e in doc["traceEvents"]}
    assert {"M", "X", "i", "s", "f", "C"} <= phases  # slices, grants, flows, counters


def test_one_process_per_node_and_one_track_per_thread(
    recorded_trace: Path, tmp_path: Path
) -> None:
    doc = load(recorded_trace, tmp_path)
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs == {0: "node 0", 1: "node 1"}
    threads = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {(e["pid"], e["tid"]) for e in slices} == threads
    assert {tid for _, tid in threads} == {0, 1, 2, NODE_TID}  # 3 worker threads per node
    # metadata precedes the slices it names
    first_slice = doc["traceEvents"].index(slices[0])
    assert all(doc["traceEvents"].index(m) < first_slice for m in meta)


def test_slices_cover_every_round_and_are_ordered_per_track(
    recorded_trace: Path, tmp_path: Path
) -> None:
    doc = load(recorded_trace, tmp_path)
    with tracer.open(recorded_trace) as trace:
        run = trace.run()
        want = {(i.op, i.invocation, i.node) for i in run.invocations()}
        bodies = sum(i.bodies for i in run.invocations())
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "round"]
    slices = [e for e in slices if e["tid"] != NODE_TID]  # the threads' round slices
    got = {(e["args"]["op"], e["args"]["invocation"], e["pid"]) for e in slices}
    assert got == want
    assert sum(e["args"]["bodies"] for e in slices) == bodies
    tracks: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for e in slices:
        tracks[(e["pid"], e["tid"])].append(e)
    for evs in tracks.values():
        ts = [e["ts"] for e in evs]
        assert ts == sorted(ts)
        for a, b in zip(evs, evs[1:], strict=False):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3  # slices on one track never overlap
