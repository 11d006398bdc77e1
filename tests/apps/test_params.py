"""A built-in app's parameter that is not a finite number is one line and exit 2.

A range check such as ``gamma <= 0`` lets NaN through, and an infinite rate passes
``> 0``: such runs trained a model of NaNs, exited 0 and printed numpy's warnings.
"""

from __future__ import annotations

import importlib
import typing

import pytest

from replay._apps import BUILTIN_APPS
from tests import cli as tcli

#: (app, float parameter) for every float-annotated parameter of every built-in app's
#: train function: a parameter added later is covered without editing this test.
FLOAT_PARAMS = sorted(
    (app, name)
    for app, target in BUILTIN_APPS.items()
    for name, kind in typing.get_type_hints(
        getattr(importlib.import_module(target.split(":")[0]), target.split(":")[1])
    ).items()
    if kind is float
)

#: What keeps a run that got past the check offline and short (it should never get there).
OFFLINE = {
    "lasso": ["dataset=synthetic", "samples=20", "features=10", "nonzeros=2", "iterations=1"],
    "lda": ["synthetic=true", "iterations=1", "docs=10"],
    "mlr": ["synthetic=true", "epochs=1"],
    "sgdmf": ["synthetic=true", "epochs=1", "kernel=false"],
    "transe": ["synthetic=true", "epochs=1"],
    "word2vec": ["synthetic=true", "epochs=1"],
}


def test_every_built_in_app_has_float_parameters() -> None:
    assert {app for app, _ in FLOAT_PARAMS} == set(BUILTIN_APPS) == set(OFFLINE)


#: How a user may spell a value that is not finite (Python's float() takes them all).
NOT_FINITE = ["nan", "inf", "-inf", "NaN", "+Infinity", "-nan"]


@pytest.mark.parametrize(
    "app,name,value",
    [(app, name, NOT_FINITE[i % len(NOT_FINITE)]) for i, (app, name) in enumerate(FLOAT_PARAMS)],
)
def test_a_parameter_that_is_not_finite_is_refused(app: str, name: str, value: str) -> None:
    args = [a for p in OFFLINE[app] if not p.startswith(f"{name}=") for a in ("-p", p)]
    res = tcli.invoke(["run", app, *args, "-p", f"{name}={value}", "--no-trace", "-q"])
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, err)
    assert len(err.splitlines()) == 1, err
    assert f"parameter {name}=" in err and "not a finite number" in err, err


@pytest.mark.parametrize("param", ["init_std=-1", "lam=-0.5", "decay=0", "decay=-1"])
def test_sgdmf_refuses_a_negative_scale_rate_or_decay(param: str) -> None:
    """init_std=-1 failed inside numpy as the program's error (exit 1); a negative lam or
    a decay <= 0 (a negative learning rate from the second epoch) trained on silently."""
    args = ["run", "sgdmf", "-p", "synthetic=true", "-p", "epochs=1", "-p", "kernel=false"]
    res = tcli.invoke([*args, "-p", param, "--no-trace", "-q"])
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, err)
    assert len(err.splitlines()) == 1 and "sgdmf: need" in err, err
