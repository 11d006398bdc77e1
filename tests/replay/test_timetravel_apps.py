"""Time travel on every built-in app (issue 34, point 6).

A checkpoint must hold every DDS the rest of the run reads, relaxed ones included: LDA's
checkpoints held ``word_topic`` and ``z`` but not the relaxed ``doc_topic`` and
``topic_total``, so ``replay single TRACE --from gibbs:K`` restored a wrong state and
reported a divergence at the first objective.  Each app is recorded here with a
checkpoint after every invocation and replayed from a middle one, in-process (about
15 s for all of them; sgdmf and word2vec take the longest, for numba's compilation).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracer
from replay._cli import cli

#: app, its small synthetic parameters, the point to replay from and the checkpoint that
#: replay starts after (the invocation run just before that point)
APPS = [
    ("sgdmf", ["-p", "synthetic=true", "-p", "rank=4", "-p", "epochs=4"], "sgd:2", ("sgd", 1)),
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


def invoke(*args: str) -> dict:
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == 0, (args, res.exit_code, res.stdout, res.stderr)
    return json.loads(res.stdout)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("app,params,point,start", APPS, ids=[a[0] for a in APPS])
def test_replay_from_a_middle_invocation_is_identical(
    tmp_path: Path,
    app: str,
    params: list[str],
    point: str,
    start: tuple[str, int],
    threads: int,
) -> None:
    trace = str(tmp_path / "t.sqlite")
    invoke(
        "run", app, *params, "--threads", str(threads), "--ranks", "1",
        "--checkpoint-every", "1", "--trace", trace, "--json",
    )  # fmt: skip
    got = invoke("single", trace, "--from", point, "--json")
    assert got["identical"] and got["complete"], got["first_difference"]
    # it did start in the middle: after the checkpoint of the invocation before
    assert (got["from"]["op"], got["from"]["invocation"]) == start
    assert got["checked"]["digests"] > 0 and got["checked"]["objectives"] > 0


def test_lda_checkpoints_hold_its_relaxed_dds(tmp_path: Path) -> None:
    trace = str(tmp_path / "t.sqlite")
    invoke(
        "run", "lda", *APPS[-1][1], "--ranks", "1", "--checkpoint-every", "1",
        "--trace", trace, "--json",
    )  # fmt: skip
    with tracer.open(trace) as store:
        run = store.run()
        first = run.checkpoints()[0]
        held = set(run.checkpoint_state(first.op, first.invocation).rows)
    assert {"doc_topic", "topic_total", "word_topic", "z"} <= held


def test_lda_history_and_watch_of_a_relaxed_dds(tmp_path: Path) -> None:
    """``history`` from a checkpoint in the middle gives what the whole replay gives, and
    ``watch`` can name a relaxed DDS (it watches what checkpoints hold)."""
    trace = str(tmp_path / "t.sqlite")
    invoke(
        "run", "lda", *APPS[-1][1], "--ranks", "1", "--checkpoint-every", "1",
        "--trace", trace, "--json",
    )  # fmt: skip
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
