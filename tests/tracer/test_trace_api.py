"""The public face of ``tracer``: exported names and the error hierarchy."""

from __future__ import annotations

import dataclasses

import pytest

import tracer


def test_all_is_exactly_the_public_names() -> None:
    public = {n for n in dir(tracer) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(tracer, n)).__name__ == "module"}
    assert set(tracer.__all__) == public - modules - {"annotations"}  # __future__ import
    assert len(tracer.__all__) == len(set(tracer.__all__))


def test_errors_inherit_the_builtin_they_resemble() -> None:
    assert issubclass(tracer.TraceFormatError, tracer.TracerError)
    assert issubclass(tracer.TraceFormatError, ValueError)
    assert issubclass(tracer.TraceNotFoundError, FileNotFoundError)
    assert issubclass(tracer.RunNotFoundError, LookupError)
    assert tracer.TracerError.__bases__ == (Exception,)


@pytest.mark.parametrize("cls", tracer.EVENT_TYPES)
def test_events_are_frozen_slotted_and_carry_node_and_seq(cls: type) -> None:
    fields = [f.name for f in dataclasses.fields(cls)]
    assert fields[:2] == ["node", "seq"]
    assert hasattr(cls, "__slots__")
    assert cls.__dataclass_params__.frozen
    assert cls.__name__.endswith(("ed", "Made"))  # past tense


def test_recorder_implements_the_engine_interface() -> None:
    import engine

    assert issubclass(tracer.TraceRecorder, engine.Recorder)
    for name in vars(engine.Recorder):
        if not name.startswith("_"):
            assert name in vars(tracer.TraceRecorder), name
