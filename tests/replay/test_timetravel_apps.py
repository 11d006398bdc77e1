"""Time travel on every built-in app (issue 34, point 6): ``--from``, ``history``,
``watch`` and ``resume`` give what the whole run gives, on all six.

A checkpoint must hold every DDS the rest of the run reads, relaxed ones included: LDA's
checkpoints held ``word_topic`` and ``z`` but not the relaxed ``doc_topic`` and
``topic_total``, so ``replay single TRACE --from gibbs:K`` restored a wrong state and
reported a divergence at the first objective.  Each app is recorded once per thread
count here (module fixture ``recorded``) with a checkpoint after every invocation, and
every command runs in this process.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tracer
from tests.cli import invoke as run_command

#: app, its small synthetic parameters, the point to replay from and the checkpoint that
#: replay starts after (the invocation run just before that point)
APPS = [
    (
        "sgdmf",
        ["-p", "synthetic=true", "-p", "synthetic_ratings=5000", "-p", "rank=4", "-p", "epochs=4"],
        "sgd:2",
        ("sgd", 1),
    ),
    ("mlr", ["-p", "synthetic=true", "-p", "epochs=4"], "mlr:2", ("mlr", 1)),
    ("transe", ["-p", "synthetic=true", "-p", "epochs=4", "-p", "dim=8"], "rel:2", ("ent2", 2)),
    (
        "lasso",
        ["-p", "dataset=synthetic", "-p", "samples=100", "-p", "features=200"]
        + ["-p", "nonzeros=5", "-p", "threshold=0.3", "-p", "iterations=8", "-p", "compare=false"],
        "lasso:4",
        ("lasso", 3),
    ),
    (
        "word2vec",
        ["-p", "synthetic=true", "-p", "dim=16", "-p", "epochs=3", "-p", "minibatch=4"],
        "sgns:2",
        ("sgns", 1),
    ),
    (
        "lda",
        ["-p", "synthetic=true", "-p", "topics=5", "-p", "iterations=8"],
        "gibbs:4",
        ("gibbs", 3),
    ),
]


#: An element of a DDS of each app that changes over the run (``history``, ``watch``).
ELEMENT = {
    "sgdmf": "W[3]",
    "mlr": "W[1]",
    "transe": "E[2]",
    "lasso": "beta[6]",
    "word2vec": "W_in[1]",
    "lda": "topic_total[0]",
}
#: The apps behind a kill switch (``RESUME_KILL``), otherwise the built-in ones unchanged.
KILLABLE = Path(__file__).with_name("resume_apps.py")
PARAMS = {a[0]: a[1] for a in APPS}
IDS = [a[0] for a in APPS]


def invoke(*args: str, env: dict[str, str] | None = None) -> dict:
    res = run_command(args, env=env)
    assert res.returncode == 0, (args, res.returncode, res.stdout, res.stderr)
    return json.loads(res.stdout)


def _record(trace: Path, target: str, app: str, threads: int, **env: str) -> Any:
    args = ["run", target, *PARAMS[app], "--threads", str(threads), "--ranks", "1"]
    args += ["--checkpoint-every", "1", "--trace", str(trace), "--json"]
    return run_command(args, env=env)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], tuple[str, dict]]:
    """``recorded(app, threads)``: (trace, ``run --json``) of the app's uninterrupted run,
    recorded once for the module (commands below only read it or add verdicts)."""
    made: dict[tuple[str, int], tuple[str, dict]] = {}

    def get(app: str, threads: int) -> tuple[str, dict]:
        if (app, threads) not in made:
            trace = tmp_path_factory.mktemp(f"{app}-{threads}") / "t.sqlite"
            res = _record(trace, app, app, threads)
            assert res.returncode == 0, res.stderr
            made[app, threads] = (str(trace), json.loads(res.stdout))
        return made[app, threads]

    return get


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("app,params,point,start", APPS, ids=IDS)
def test_replay_from_a_middle_invocation_is_identical(
    recorded: Callable[[str, int], tuple[str, dict]],
    app: str,
    params: list[str],
    point: str,
    start: tuple[str, int],
    threads: int,
) -> None:
    trace, _ = recorded(app, threads)
    got = invoke("single", trace, "--from", point, "--json")
    assert got["identical"] and got["complete"], got["first_difference"]
    # it did start in the middle: after the checkpoint of the invocation before
    assert (got["from"]["op"], got["from"]["invocation"]) == start
    assert got["checked"]["digests"] > 0 and got["checked"]["objectives"] > 0


def _history(trace: str, app: str, *extra: str) -> list[dict]:
    return invoke("history", trace, ELEMENT[app], *extra, "--json")["history"]


@pytest.mark.parametrize("app", IDS)
def test_history_between_checkpoints_is_the_whole_history(
    recorded: Callable[[str, int], tuple[str, dict]], app: str
) -> None:
    """``history`` from a checkpoint in the middle (fast-forwarded) gives exactly the
    entries the replay of the whole run gives, and the element does change."""
    trace, _ = recorded(app, 1)
    whole = _history(trace, app)
    assert len({json.dumps(e["value"]) for e in whole}) > 1, whole  # a moving element
    op, last = whole[-1]["op"], whole[-1]["invocation"]
    lo = max(1, last // 2)
    part = _history(trace, app, "--between", f"{op}:{lo}", f"{op}:{last}")
    keys = [(e["op"], e["invocation"]) for e in whole]  # program order, ops interleaved
    assert part and part == whole[keys.index((op, lo)) : keys.index((op, last)) + 1]


@pytest.mark.parametrize("app", IDS)
def test_watch_stops_where_history_first_shows_the_value(
    recorded: Callable[[str, int], tuple[str, dict]], app: str
) -> None:
    """``watch ELEMENT == v`` (not monotone: an equality) for the value the element has
    in the middle of the run stops after the first invocation whose history shows it,
    having checked every invocation."""
    trace, _ = recorded(app, 1)
    whole = _history(trace, app)
    value = whole[len(whole) // 2]["value"]
    first = next(e for e in whole if e["value"] == value)
    found = invoke("watch", trace, f"np.all({ELEMENT[app]} == np.array({value!r}))", "--json")
    assert found["found"] and (found["op"], found["invocation"]) == (
        first["op"],
        first["invocation"],
    ), (found, first)
    assert found["checked"] == "every invocation" and found["unchecked"] == 0


@pytest.mark.parametrize("app", IDS)
def test_resume_after_an_interrupt_is_the_uninterrupted_run(
    recorded: Callable[[str, int], tuple[str, dict]], app: str, tmp_path: Path
) -> None:
    """Stopped (Ctrl-C) in the second body of the middle invocation and resumed from the
    last checkpoint: objectives and digests are bitwise those of the run never stopped,
    and ``history`` of the resumed run is the whole run's from where it resumed."""
    trace, whole = recorded(app, 1)
    with tracer.open(trace) as store:
        invocations = len(store.run().checkpoints())  # one checkpoint after each
    crashed = tmp_path / "t.sqlite"
    kill = {"RESUME_KILL": f"0:{invocations // 2}:1", "RESUME_HOW": "interrupt"}
    res = _record(crashed, f"{KILLABLE}:app_{app}", app, 1, **kill)
    assert res.returncode == 130, (res.returncode, res.stderr)
    got = invoke("resume", str(crashed), "--json")
    assert got["objectives"] == whole["objectives"], app  # bitwise: floats from JSON
    assert got["digests"] == whole["digests"], app
    at = (got["resumed_from"]["op"], got["resumed_from"]["invocation"])
    full = _history(trace, app)
    keys = [(e["op"], e["invocation"]) for e in full]
    assert _history(str(crashed), app) == full[keys.index(at) + 1 :], at


def test_lda_checkpoints_hold_its_relaxed_dds(
    recorded: Callable[[str, int], tuple[str, dict]],
) -> None:
    trace, _ = recorded("lda", 1)
    with tracer.open(trace) as store:
        run = store.run()
        first = run.checkpoints()[0]
        held = set(run.checkpoint_state(first.op, first.invocation).rows)
    assert {"doc_topic", "topic_total", "word_topic", "z"} <= held


def test_lda_history_and_watch_of_a_relaxed_dds(
    recorded: Callable[[str, int], tuple[str, dict]],
) -> None:
    """``history`` from a checkpoint in the middle gives what the whole replay gives, and
    ``watch`` can name a relaxed DDS (it watches what checkpoints hold)."""
    trace, _ = recorded("lda", 1)
    whole = invoke("history", trace, "topic_total[0]", "--json")["history"]
    part = invoke("history", trace, "topic_total[0]", "--between", "gibbs:4", "gibbs:6", "--json")[
        "history"
    ]
    assert [e["invocation"] for e in part] == [4, 5, 6]
    assert part == [e for e in whole if 4 <= e["invocation"] <= 6]
    value = whole[5]["value"]
    first = next(e["invocation"] for e in whole if e["value"] == value)
    found = invoke("watch", trace, f"(topic_total[0] == np.array({value})).all()", "--json")
    assert found["found"] and (found["op"], found["invocation"]) == ("gibbs", first)
