"""Module behaviour: registration, traversal, state dicts named as PyTorch names them, modes."""

import re

import numpy as np
import pytest

from onemodel.tensors import Generator, OneModelError, Tensor
from onemodel.training import (
    BatchNorm2d,
    Conv2d,
    Dropout,
    Linear,
    Module,
    ModuleList,
    Parameter,
    ReLU,
    Sequential,
    StateDictError,
)

torch = pytest.importorskip("torch")


class Net(Module):
    def __init__(self):
        super().__init__()
        self.conv = Conv2d(1, 2, 3)
        self.bn = BatchNorm2d(2)
        self.blocks = ModuleList([Linear(8, 8), Linear(8, 8)])
        self.head = Sequential(ReLU(), Linear(8, 3))
        self.scale = Parameter(np.ones(1, np.float32))
        self.register_buffer("steps", Tensor.zeros(1))
        self.register_buffer("cache", Tensor.zeros(1), persistent=False)
        self.drop = Dropout(0.5)


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.bn = torch.nn.BatchNorm2d(2)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])
        self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(8, 3))
        self.scale = torch.nn.Parameter(torch.ones(1))
        self.register_buffer("steps", torch.zeros(1))
        self.register_buffer("cache", torch.zeros(1), persistent=False)
        self.drop = torch.nn.Dropout(0.5)


def test_state_dict_names_and_order_match_pytorch():
    ours, theirs = Net(), TorchNet()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    assert len(list(ours.modules())) == len(list(theirs.modules()))
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]


def test_load_state_dict_accepts_tensors_and_arrays_and_reports_problems():
    net = Net()
    sd = {k: v.numpy() * 0 + 1 for k, v in net.state_dict().items()}
    sd["conv.weight"] = Tensor.from_numpy(sd["conv.weight"])
    net.load_state_dict(sd)
    assert net.conv.weight.numpy().sum() == net.conv.weight.numel()
    bad = dict(sd)
    del bad["bn.bias"]
    bad["extra"] = np.zeros(1)
    bad["head.1.weight"] = np.zeros((4, 4))
    with pytest.raises(StateDictError) as err:
        net.load_state_dict(bad)
    msg = str(err.value)
    assert "missing keys: bn.bias" in msg and "unexpected keys: extra" in msg
    assert "mis-shaped keys: head.1.weight: expected [3, 8], got [4, 4]" in msg
    assert net.head[1].weight.numpy().sum() == 24  # nothing was copied


def test_train_eval_and_call():
    net = Net()
    assert net.training and net.bn.training
    net.eval()
    assert not net.training and not net.bn.training and not net.blocks[1].training
    x = Tensor.ones(2, 8)
    assert net.drop(x).tolist() == x.tolist()
    net.train()
    assert net.drop.training


def test_repr_is_like_pytorch():
    m = Sequential(Linear(2, 3), ReLU())
    assert repr(m) == ("Sequential(\n  (0): Linear(in_features=2, out_features=3, bias=True)\n"
                       "  (1): ReLU()\n)")


def test_forgetting_super_init_is_explained():
    class Bad(Module):
        def __init__(self):
            self.w = 1

    with pytest.raises(OneModelError, match=re.escape("super().__init__()")):
        Bad()


def test_trace_without_tracing_package_names_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onemodel.tracing", None)
    with pytest.raises(OneModelError, match="pip install onemodel-tracing"):
        Linear(1, 1, Generator(0)).trace(Tensor.zeros(4, 1), "batch", None)
