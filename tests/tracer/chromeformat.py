"""A validator for the Trace Event Format (the JSON chrome://tracing and Perfetto load).

It checks what a viewer relies on: required fields and types per phase, named tracks,
complete (``X``) slices that never overlap on a track unless properly nested, balanced
``B``/``E``, numeric counters, and flows (``s``/``t``/``f``) that pair up and bind to a
slice enclosing their timestamp.  ``problems(doc)`` lists every violation it finds.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

PHASES = {"X", "B", "E", "i", "I", "C", "s", "t", "f", "M"}
META_NAMES = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}
#: Slack for µs timestamps rounded to ns.
EPS = 1e-3


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _event_problems(k: int, ev: Any) -> list[str]:
    if not isinstance(ev, dict):
        return [f"event {k} is not an object"]
    ph = ev.get("ph")
    if ph not in PHASES:
        return [f"event {k}: unknown phase {ph!r}"]
    out = []
    need = {"name", "ph", "pid"} | ({"ts"} if ph != "M" else set())
    need |= {"tid"} if ph not in ("C", "M") else set()
    need |= {"dur"} if ph == "X" else set()
    need |= {"id", "cat"} if ph in ("s", "t", "f") else set()
    for key in sorted(need - set(ev)):
        out.append(f"event {k} ({ph}): no {key!r}")
    if "name" in ev and not isinstance(ev["name"], str):
        out.append(f"event {k}: name {ev['name']!r} is not a string")
    for key in ("pid", "tid"):
        if key in ev and not _int(ev[key]):
            out.append(f"event {k}: {key} {ev[key]!r} is not an integer")
    for key in ("ts", "dur"):
        if key in ev and not (_num(ev[key]) and ev[key] >= 0):
            out.append(f"event {k}: {key} {ev[key]!r} is not a non-negative number")
    if "args" in ev and not isinstance(ev["args"], dict):
        out.append(f"event {k}: args is not an object")
    if "cat" in ev and not isinstance(ev["cat"], str):
        out.append(f"event {k}: cat is not a string")
    if ph in ("i", "I") and ev.get("s", "t") not in ("g", "p", "t"):
        out.append(f"event {k}: instant scope {ev['s']!r} is not g, p or t")
    if ph == "C":
        args = ev.get("args")
        if not isinstance(args, dict) or not args or not all(_num(v) for v in args.values()):
            out.append(f"event {k}: counter args {args!r} are not numbers")
    if ph in ("s", "t", "f") and "id" in ev and not (_int(ev["id"]) or isinstance(ev["id"], str)):
        out.append(f"event {k}: flow id {ev['id']!r} is neither integer nor string")
    if ph == "f" and ev.get("bp", "e") != "e":
        out.append(f"event {k}: flow binding point {ev['bp']!r} is not 'e'")
    if ph == "M":
        args = ev.get("args")
        if ev.get("name") not in META_NAMES:
            out.append(f"event {k}: unknown metadata {ev.get('name')!r}")
        elif not isinstance(args, dict):
            out.append(f"event {k}: metadata without args")
        elif ev["name"].endswith("_name") and not isinstance(args.get("name"), str):
            out.append(f"event {k}: {ev['name']} without a string args.name")
        elif ev["name"].endswith("_sort_index") and not _int(args.get("sort_index")):
            out.append(f"event {k}: {ev['name']} without an integer args.sort_index")
    return out


def _slice_problems(events: list[dict]) -> tuple[list[str], dict]:
    """Overlap and B/E checks; returns the slices per track for flow binding."""
    out: list[str] = []
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    open_b: dict[tuple[int, int], list[float]] = defaultdict(list)
    for ev in sorted(events, key=lambda e: e["ts"]):
        key = (ev["pid"], ev["tid"])
        if ev["ph"] == "X":
            tracks[key].append((ev["ts"], ev["ts"] + ev["dur"]))
        elif ev["ph"] == "B":
            open_b[key].append(ev["ts"])
        elif ev["ph"] == "E":
            if not open_b[key]:
                out.append(f"track {key}: E at {ev['ts']} without a B")
            else:
                tracks[key].append((open_b[key].pop(), ev["ts"]))
    out += [f"track {k}: {len(v)} B without E" for k, v in open_b.items() if v]
    for key, spans in tracks.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[float] = []
        for start, end in spans:
            while stack and stack[-1] <= start + EPS:
                stack.pop()
            if stack and end > stack[-1] + EPS:
                out.append(f"track {key}: slice [{start}, {end}] overlaps one ending {stack[-1]}")
            stack.append(end)
    return out, tracks


def _encloses(spans: list[tuple[float, float]], ts: float) -> bool:
    return any(s < ts < e or s == ts == e for s, e in spans)


def _flow_problems(events: list[dict], tracks: dict) -> list[str]:
    out = []
    flows: dict[tuple[str, Any], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for ev in events:
        if ev["ph"] in ("s", "t", "f"):
            flows[(ev["cat"], ev["id"])][ev["ph"]].append(ev)
    for key, by in flows.items():
        if len(by["s"]) != 1 or len(by["f"]) != 1:
            out.append(f"flow {key}: {len(by['s'])} start(s) and {len(by['f'])} finish(es)")
            continue
        if by["s"][0]["name"] != by["f"][0]["name"]:
            out.append(f"flow {key}: start and finish have different names")
        for ev in (*by["s"], *by["t"], *by["f"]):
            if not _encloses(tracks.get((ev["pid"], ev["tid"]), []), ev["ts"]):
                out.append(
                    f"flow {key}: {ev['ph']} at {ev['ts']} on {ev['pid']}/{ev['tid']} binds to no slice"
                )
    return out


def problems(doc: Any) -> list[str]:
    """Every way ``doc`` breaks the Trace Event Format (empty: it is valid)."""
    try:
        json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return [f"not strict JSON: {exc}"]
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["not an object with a traceEvents list"]
    if doc.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        return [f"displayTimeUnit {doc['displayTimeUnit']!r} is not ms or ns"]
    events = doc["traceEvents"]
    out = [p for k, ev in enumerate(events) for p in _event_problems(k, ev)]
    if out:
        return out
    timed = [e for e in events if e["ph"] != "M"]
    slice_out, tracks = _slice_problems([e for e in timed if e["ph"] in "XBE"])
    out += slice_out + _flow_problems(timed, tracks)
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    procs = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    for e in timed:
        if "tid" in e and e["ph"] != "C" and (e["pid"], e["tid"]) not in named:
            out.append(f"track {e['pid']}/{e['tid']} has events but no thread_name")
            named.add((e["pid"], e["tid"]))
        if e["pid"] not in procs:
            out.append(f"process {e['pid']} has events but no process_name")
            procs.add(e["pid"])
    return out


__all__ = ["problems"]
