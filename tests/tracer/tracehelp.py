"""Helpers of the tracer tests: record small real traces from engine runs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

import engine as ap
import tracer


def toy_program(n: int = 240, epochs: int = 2, width: int = 4):
    """A loop where bodies share a few hot rows (so split groups take locks) and logs."""

    def program() -> None:
        X = ap.dvector(width, shape=(), init=ap.init.zeros(), name="X")
        Y = ap.dvector(n, shape=(), init=ap.init.zeros(), name="Y")

        def body(j: int) -> None:
            X[j % width] += 1.0
            Y[j] = X[j % width] * 0.5

        for it in range(epochs):
            ap.async_for(0, n, body, name="acc")
            ap.log_objective("total", float(it))

    return program


def record(
    path: Path,
    *,
    nodes: int = 2,
    threads: int = 3,
    n: int = 240,
    epochs: int = 2,
    run_id: str = "run-1",
    program: Any = None,
) -> ap.RunResult:
    """Record one in-process run of ``program`` (default: the toy loop) into ``path``."""
    meta = {"app": "toy", "params": {"n": n}, "ranks": nodes, "threads": threads, "seed": 0}
    tracer.start_run(path, run_id, meta)
    rec = tracer.TraceRecorder(path, run_id, range(nodes), True)
    try:
        res = ap.run(program or toy_program(n, epochs), nodes=nodes, threads=threads, recorder=rec)
    except BaseException as exc:
        rec.close("failed", repr(exc))
        raise
    rec.close("finished")
    return res


def digest(path: Path) -> str:
    """blake2b of a file's bytes (to check a file was not modified)."""
    return hashlib.blake2b(path.read_bytes()).hexdigest()


def reseal(path: Path) -> None:
    """Recompute every manifest and link of an unkeyed trace after an edit, as a
    determined editor could (the run row's genesis and the side chains included)."""
    from sqlalchemy import create_engine, select

    from tracer._chain import (
        CODE,
        GENESIS_NODE,
        GROUP_MANIFEST_DTYPE,
        MANIFEST_DTYPE,
        SEQ_COLUMN,
        SIDE,
        genesis,
        group_manifest,
        link_of,
        manifest,
        side_key,
        side_manifest,
    )
    from tracer._schema import ChainLink, Run

    eng = create_engine(f"sqlite:///{path}")
    with eng.begin() as conn:
        runs = {r.run_id: r._mapping for r in conn.execute(select(Run.__table__))}
        links = conn.execute(select(ChainLink.__table__)).all()
        prev: dict[tuple[str, int, bool], bytes] = {}
        for ln in sorted(links, key=lambda ln: (ln.run, ln.node, ln.link_no < 0, abs(ln.link_no))):
            side = ln.link_no < 0
            if side:  # the rows the old manifest named, as they are now
                named = {
                    (int(e["table"]), int(e["seq"]))
                    for e in np.frombuffer(bytes(ln.manifest), dtype=MANIFEST_DTYPE)
                }
                entries = [
                    (model, r._mapping)
                    for model, code in SIDE.items()
                    for r in conn.execute(select(model.__table__).where(model.run == ln.run))
                    if (code, side_key(model, r._mapping)) in named
                ]
                man = side_manifest(entries)
            elif '"_trace_schema": 7' in str(runs[ln.run]["versions"]):
                # schema 7: the rows the old manifest named (any node), as they are now
                named = {
                    (int(e["table"]), int(e["node"]), int(e["seq"]))
                    for e in np.frombuffer(bytes(ln.manifest), dtype=GROUP_MANIFEST_DTYPE)
                }
                entries = [
                    (model, r._mapping)
                    for model, col in SEQ_COLUMN.items()
                    for r in conn.execute(select(model.__table__).where(model.run == ln.run))
                    if (CODE[model], int(r.node), int(getattr(r, col))) in named
                ]
                man = group_manifest(entries)
            else:
                entries = []
                for model, col in SEQ_COLUMN.items():
                    c = getattr(model, col)
                    stmt = select(model.__table__).where(
                        model.run == ln.run,
                        model.node == ln.node,
                        c >= ln.first_seq,
                        c < ln.end_seq,
                    )
                    entries += [(model, r._mapping) for r in conn.execute(stmt)]
                man = manifest(entries)
            start = b""
            if not side and ln.node == GENESIS_NODE:
                start = genesis(runs[ln.run])
            k = (ln.run, ln.node, side)
            link = link_of(prev.get(k, start), ln._mapping, man, None)
            prev[k] = link
            conn.execute(
                ChainLink.__table__.update()
                .where(ChainLink.id == ln.id)
                .values(manifest=man, n_rows=len(entries), link=link)
            )
    eng.dispose()
