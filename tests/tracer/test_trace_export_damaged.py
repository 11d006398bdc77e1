"""``replay export`` refuses a run that ``replay verify`` refuses (issue 36).

Exporting a damaged trace used to succeed silently while ``show`` refused it: the
timeline then showed forged or missing orders as if recorded.  Any one damaged row, in
any chained table, now makes export exit 2 with one line and write nothing; ``--damaged``
exports it anyway with a warning, and the file says it is damaged (or, when the damage
leaves rows export cannot decode, it still refuses in one line).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_trace_chain import apply, damage

from tests.traces import MLR_1


@pytest.fixture(scope="module")
def mlr1(trace_library) -> Path:
    return trace_library.get(*MLR_1)


def test_an_intact_run_exports_without_a_damage_note(mlr1: Path, tmp_path: Path, cli) -> None:
    out = tmp_path / "t.json"
    res = cli("export", mlr1, "-o", out)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    doc = json.loads(out.read_text())
    assert doc["traceEvents"] and "damaged" not in doc["otherData"]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_export_refuses_what_verify_refuses(
    mlr1: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, cli
) -> None:
    d = tmp_path_factory.mktemp("damaged")
    path = d / "t.sqlite"
    shutil.copyfile(mlr1, path)
    where = data.draw(damage(path))
    apply(path, *where)
    verify = cli("verify", path)
    assert verify.returncode == 2, where  # every chained row is covered
    out = d / "t.json"
    res = cli("export", path, "-o", out)
    err = res.stderr.strip()
    assert res.returncode == 2, (where, res.stdout, res.stderr)
    assert len(err.splitlines()) == 1 and err.startswith("replay: error: "), err
    assert "damaged" in err and "--damaged" in err and "Traceback" not in err
    assert not out.exists()
    forced = cli("export", path, "-o", out, "--damaged")
    said = forced.stderr.strip()
    assert len(said.splitlines()) == 1 and "Traceback" not in said, said
    if forced.returncode == 2:  # damage export cannot even decode: one line, nothing written
        assert said.startswith("replay: error: "), said
        assert "damaged" in said or "corrupt" in said, said
        assert not out.exists()
        return
    assert forced.returncode == 0, (where, forced.stderr)
    assert said.startswith("replay: warning: "), said
    assert "is damaged" in json.loads(out.read_text())["otherData"]["damaged"]
