"""``--run`` takes a run's id or a prefix of it, as the commands print ids (12 characters):
a prefix names a run only when no other run of the trace starts with it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tracer
from tracer._read import MIN_RUN_PREFIX, pick_run

HEX = "0123456789abcdef"


@given(
    st.lists(st.text(HEX, min_size=8, max_size=8), min_size=1, max_size=8, unique=True),
    st.text(HEX, max_size=9),
)
def test_a_query_names_exactly_the_run_it_starts_or_is_refused(ids: list[str], query: str) -> None:
    # ids drawn from a small alphabet so that shared prefixes, exact ids and misses all occur
    exact = query in ids
    starts = [i for i in ids if i.startswith(query)]
    try:
        got = pick_run(ids, query, "t.sqlite")
    except tracer.RunNotFoundError as exc:
        assert not exact
        assert len(query) < MIN_RUN_PREFIX or len(starts) != 1
        assert "\n" not in str(exc)
        return
    assert ids[got] == query if exact else (len(query) >= MIN_RUN_PREFIX and starts == [ids[got]])


def test_an_ambiguous_prefix_names_the_runs_it_could_be() -> None:
    ids = ["abcdef01" + "0" * 24, "abcdef02" + "0" * 24]
    with pytest.raises(tracer.RunNotFoundError, match=r"start of 2 runs' ids .*give more"):
        pick_run(ids, "abcdef", "t.sqlite")
    assert pick_run(ids, "abcdef02", "t.sqlite") == 1


def test_the_printed_short_id_works_as_run(tmp_path: Path, cli) -> None:
    trace = tmp_path / "t.sqlite"
    rec = cli(
        "run",
        "sgdmf",
        "-p",
        "synthetic=true",
        "-p",
        "synthetic_ratings=500",
        "-p",
        "epochs=1",
        "-p",
        "kernel=false",
        "--trace",
        trace,
    )
    assert rec.returncode == 0, rec.stderr
    said = cli("single", trace)  # "replaying run 0a9656233df5 (sgdmf, ...": what users copy
    short = re.search(r"replaying run ([0-9a-f]{12}) ", said.stdout + said.stderr).group(1)
    whole = json.loads(cli("show", trace, "--json").stdout)["runs"][0]["run_id"]
    assert whole.startswith(short) and len(whole) > len(short)
    for args in (
        ("show", trace, "--run", short, "--json"),
        ("verify", trace, "--run", short),
        ("single", trace, "--run", short, "--json"),
    ):
        proc = cli(*args)
        assert proc.returncode == 0, (args, proc.stderr)
    rep = json.loads(cli("single", trace, "--run", short, "--json").stdout)
    assert rep["identical"] is True
    short_run = cli("show", trace, "--run", short[:3])
    assert short_run.returncode == 2 and "too short" in short_run.stderr
    assert short_run.stderr.count("\n") == 1
