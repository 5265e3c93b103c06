"""An ``onnx.backend.base.Backend`` over the OneModel runtime, so ONNX's backend test suite
(and anything else written against that interface) runs OneModel sessions."""

from __future__ import annotations

import numpy as np

from onemodel.runtime import Session
from onnx.backend.base import Backend, BackendRep

from .importer import from_model


class OneModelRep(BackendRep):
    def __init__(self, session: Session):
        self.session = session

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = inputs
        else:
            names = [i.name for i in self.session.inputs]
            feeds = dict(zip(names, inputs))
        feeds = {k: _feed(v) for k, v in feeds.items()}
        out = self.session.run(feeds)
        return [_result(out[o.name]) for o in self.session.outputs]


def _feed(v):
    """Arrays as arrays; a sequence (list) and an empty optional (None) as they are."""
    if v is None or isinstance(v, list):
        return v
    return np.asarray(v)


def _result(r):
    if r is None:  # an empty optional
        return None
    if isinstance(r, list):  # a sequence
        return [t.numpy() for t in r]
    return r.numpy()


class OneModelBackend(Backend):
    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> OneModelRep:
        return OneModelRep(Session(from_model(model), optimize=kwargs.get("optimize", True)))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)
