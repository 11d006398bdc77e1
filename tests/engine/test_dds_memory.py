"""A numeric DDS larger than the memory the machine has free is refused in one line
before it is allocated: numpy hands out pages lazily, so the run would otherwise start,
fill its replicas and thrash or be killed later.  Its size may come from a parameter a
trace chose (``rank=5000000`` for SGDMF asked for 37 GiB on a 24 GiB machine)."""

from __future__ import annotations

import numpy as np
import pytest

import engine as ap
from engine._data import dds as _dds


@pytest.mark.parametrize("nodes", [1, 3])
def test_a_dvector_beyond_free_memory_is_one_line(
    nodes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1,000 rows of 4 float64 = 32,000 B per copy: one copy per node, one for the init
    monkeypatch.setattr(_dds, "available_memory", lambda: 32_000 * nodes + 31_999)
    with pytest.raises(ap.DDSError) as err:
        ap.run(
            lambda: ap.dvector(1000, shape=(4,), init=ap.init.normal(0, 1), name="X"), nodes=nodes
        )
    assert "dvector X: 1,000 rows of shape (4,) (float64) need" in str(err.value)
    assert f"({nodes + 1} copies)" in str(err.value) and "\n" not in str(err.value)
    # what fits is made: zeros need no initial copy, given data is the caller's already
    ap.run(lambda: ap.dvector(1000, shape=(4,), name="Z"), nodes=nodes)
    ap.run(lambda: ap.dvector(1000, shape=(4,), data=np.zeros((1000, 4)), name="D"), nodes=nodes)


def test_an_app_parameter_that_asks_too_much_is_exit_2(
    cli, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_dds, "available_memory", lambda: 2**30)
    res = cli(
        "run", "sgdmf", "-p", "synthetic=true", "-p", "rank=500000", "--no-trace", cwd=tmp_path
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "GiB of memory this machine has free" in res.stderr


def test_free_memory_is_read_where_the_machine_says_it() -> None:
    have = _dds.available_memory()
    assert have is None or have > 0
