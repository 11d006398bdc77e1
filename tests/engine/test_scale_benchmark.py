"""benchmarks/scale.py --quick, in this process: its JSON shape and the transport counters."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import scale

FIELDS = (
    "bytes_per_epoch_p64_ml100k",
    "messages_per_epoch_p64",
    "imbalance_p64_ml100k",
    "imbalance_p64_synthetic",
    "trace_bytes_per_body_p64",
    "mem_per_node_p64_over_p1",
    "mlr_messages_per_clock_p64",
)


def test_quick_run_prints_every_figure_with_consistent_counters(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["scale.py", "--quick"])
    scale.main()
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["nodes"] == 8 and out["quick"] is True and out["data"] == "synthetic"
    assert set(out["targets"]) == set(FIELDS) == set(out["met"])
    for f in FIELDS:  # the store grows by whole pages: its growth may round to nothing
        assert out[f] > 0 or (f == "trace_bytes_per_body_p64" and out[f] == 0), f
        assert out["met"][f] == (out[f] <= out["targets"][f])
    for traffic in (out["sgdmf"]["traffic"], out["mlr"]["traffic"]):
        assert traffic["sent_messages"] > 0 and traffic["sent_bytes"] > 0
        assert traffic["received_bytes"] == traffic["sent_bytes"]
        assert traffic["received_messages"] == traffic["sent_messages"]
    sg = out["sgdmf"]
    assert out["messages_per_epoch_p64"] == sg["traffic"]["sent_messages"]
    assert out["bytes_per_epoch_p64_ml100k"] == sg["traffic"]["sent_bytes"]
    # a write-back carries at least its 8-byte header
    assert sg["traffic"]["sent_bytes"] >= 8 * sg["traffic"]["sent_messages"]
    mlr = out["mlr"]
    assert out["mlr_messages_per_clock_p64"] == round(
        mlr["traffic"]["sent_messages"] / mlr["clocks"], 1
    )
    n0, n1 = sg["node0_bytes"], sg["node0_bytes_p1"]
    assert n0["total"] == n0["dds"] + n0["recon_sets"] + n0["plan"] > 0
    assert out["mem_per_node_p64_over_p1"] == round(n0["total"] / n1["total"], 4)
    assert out["trace"]["store_bytes_5_epochs"] >= out["trace"]["store_bytes_1_epoch"] > 0
    # the imbalance figures are the token plan's critical path; the token epoch ran (more
    # rounds than the rotation, each a hand-off) and its counters agree
    tokens = out["imbalance"]["synthetic"]["tokens"]
    assert tokens["strategy"] == "tokens"
    assert out["imbalance_p64_synthetic"] == tokens["critical_path"]
    assert tokens["critical_path"] <= tokens["exchange_wait"] <= tokens["barrier"]
    assert out["imbalance"]["synthetic"]["auto"]["strategy"] == "rotation"
    tt = out["sgdmf_tokens"]
    assert tt["rounds"] > sg["rounds"]
    assert tt["traffic"]["received_bytes"] == tt["traffic"]["sent_bytes"] > 0
