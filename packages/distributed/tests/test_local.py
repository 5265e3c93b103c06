"""What runs in one process: the tape's gradient-ready hook, buckets, the sampler, and the DDP
machinery against a stand-in communicator of two identical ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onemodel.distributed import DistributedError, DistributedSampler
from onemodel.distributed.buckets import make_buckets
from onemodel.distributed.comm import Communicator
from onemodel.tensors import Generator, Tensor
from onemodel.tensors import autograd as ag
from onemodel.training import BatchNorm2d, DataLoader, Linear, ReLU, Sequential


@pytest.fixture
def hook_log():
    log = []
    hook = lambda leaf: log.append(None if leaf is None else (leaf, leaf.grad.numpy().copy()))
    ag._grad_ready_hooks.append(hook)
    yield log
    ag._grad_ready_hooks.remove(hook)


def test_grad_ready_hook_fires_once_per_leaf_after_its_last_use(hook_log):
    w = Tensor.from_numpy(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)).requires_grad_()
    b = Tensor.from_numpy(np.array([0.5, -0.5], np.float32)).requires_grad_()
    x = Tensor.from_numpy(np.array([[1.0, -1.0]], np.float32))
    h = (x @ w + b).relu()
    loss = ((h @ w) * (h @ w)).sum()  # w is used twice: ready only after both uses
    loss.backward()
    tw = torch.tensor(w.numpy(), requires_grad=True)
    tb = torch.tensor(b.numpy(), requires_grad=True)
    th = (torch.tensor(x.numpy()) @ tw + tb).relu()
    ((th @ tw) ** 2).sum().backward()
    assert hook_log[-1] is None and None not in hook_log[:-1]
    fired = {id(leaf): g for leaf, g in hook_log[:-1]}
    assert len(fired) == len(hook_log) - 1 == 2  # w and b, once each
    np.testing.assert_allclose(fired[id(w)], tw.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(fired[id(b)], tb.grad.numpy(), rtol=1e-6)
    # the value seen by the hook is the final one
    np.testing.assert_array_equal(fired[id(w)], w.grad.numpy())


def test_grad_ready_hook_order_follows_backward(hook_log):
    net = Sequential(Linear(3, 4, Generator(0)), ReLU(), Linear(4, 2, Generator(1)))
    net(Tensor.from_numpy(np.ones((2, 3), np.float32))).sum().backward()
    names = {id(p): n for n, p in net.named_parameters()}
    order = [names[id(leaf)] for leaf, _ in hook_log[:-1]]
    assert set(order[:2]) == {"2.weight", "2.bias"} and set(order[2:]) == {"0.weight", "0.bias"}


def test_buckets_cap_order_and_dtype():
    net = Sequential(Linear(10, 10, Generator(0)), Linear(10, 10, Generator(1)))
    params = list(net.parameters())  # 100, 10, 100, 10 floats
    buckets = make_buckets(params, cap_bytes=440)
    assert [[p.numel() for p in b.params] for b in buckets] == [[10, 100], [10, 100]]
    assert buckets[0].params[0] is params[3]  # last layer first, as backward produces them
    assert all(b.buffer.flags.c_contiguous and b.buffer.size == 110 for b in buckets)
    assert len(make_buckets(params, cap_bytes=1 << 20)) == 1
    assert len(make_buckets(params, cap_bytes=1)) == 4  # one each when nothing fits
    mixed = [params[0], Tensor.from_numpy(np.zeros(3, np.float64)).requires_grad_()]
    assert sorted(b.buffer.dtype.name for b in make_buckets(mixed, 1 << 20)) == ["float32",
                                                                                 "float64"]


def test_sampler_partitions_the_full_batch_order():
    full = DistributedSampler(50, num_replicas=1, rank=0, seed=3)
    parts = [DistributedSampler(50, num_replicas=2, rank=r, seed=3) for r in range(2)]
    order = full.indices()
    assert sorted(order) == list(range(50))
    for b in range(5):  # batch b of both ranks (5 rows each) = batch b of one process (10)
        got = np.concatenate([p.indices()[5 * b: 5 * b + 5] for p in parts])
        assert sorted(got) == sorted(order[10 * b: 10 * b + 10])
    before = parts[0].indices()
    parts[0].set_epoch(1)
    assert not np.array_equal(before, parts[0].indices())
    parts[0].set_epoch(0)
    np.testing.assert_array_equal(before, parts[0].indices())


def test_sampler_uneven_lengths_and_arguments():
    pads = [DistributedSampler(5, num_replicas=2, rank=r, shuffle=False) for r in range(2)]
    assert [list(p) for p in pads] == [[0, 2, 4], [1, 3, 0]]  # padded from the start
    drops = [DistributedSampler(5, num_replicas=2, rank=r, shuffle=False, drop_last=True)
             for r in range(2)]
    assert [list(p) for p in drops] == [[0, 2], [1, 3]] and len(drops[0]) == 2
    with pytest.raises(DistributedError, match=r"rank must be in \[0, 2\), got 2"):
        DistributedSampler(5, num_replicas=2, rank=2)


def test_dataloader_takes_a_sampler():
    x = np.arange(10, dtype=np.float32)[:, None]
    s = DistributedSampler(10, num_replicas=2, rank=1, shuffle=False)
    batches = [b.numpy().ravel().tolist() for (b,) in DataLoader(x, batch_size=2, sampler=s)]
    assert batches == [[1, 3], [5, 7], [9]]
    assert len(DataLoader(x, batch_size=2, sampler=s)) == 3
    with pytest.raises(Exception, match="shuffle=True or a sampler, not both"):
        DataLoader(x, sampler=s, shuffle=True)


class TwinComm(Communicator):
    """Two ranks that hold the same values: a sum doubles, a broadcast keeps. Logs each call."""

    def __init__(self):
        self.rank, self.size, self.timeout, self.log = 0, 2, 5.0, []

    def iallreduce(self, buf):
        self.log.append(("iallreduce", buf.size))
        buf *= 2
        return _Done()

    def wait(self, request, what):
        self.log.append(("wait", what))

    def allreduce_(self, buf, what="allreduce"):
        buf *= 2
        return buf

    def bcast_(self, buf, root=0, what="broadcast"):
        self.log.append(("bcast", what))
        return buf

    def barrier(self, what="barrier"):
        pass

    def dup(self):
        return self


class _Done:
    def Test(self):
        return True


def _mlp():
    return Sequential(Linear(6, 8, Generator(0)), ReLU(), Linear(8, 8, Generator(1)), ReLU(),
                      Linear(8, 3, Generator(2)))


def test_ddp_averages_in_buckets_started_during_backward(tmp_path):
    from onemodel.distributed import DistributedDataParallel

    x = Tensor.from_numpy(np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32))
    ref = _mlp()
    (ref(x) ** 2).mean().backward()

    comm = TwinComm()
    ddp = DistributedDataParallel(_mlp(), comm, bucket_cap_mb=200 / 2**20)
    assert len(ddp.buckets) >= 3
    ag._grad_ready_hooks.append(lambda leaf: leaf is None or comm.log.append(("ready",)))
    try:
        comm.log.clear()
        out = ddp(x)
        (out ** 2).mean().backward()
    finally:
        ag._grad_ready_hooks.pop()
    starts = [e for e in comm.log if e[0] == "iallreduce"]
    assert len(starts) == len(ddp.buckets)  # one collective per bucket, not per parameter
    # overlap: the first bucket is on its way before backward reaches the first layer
    last_ready = len(comm.log) - 1 - comm.log[::-1].index(("ready",))
    assert comm.log.index(starts[0]) < last_ready, comm.log
    for (_, p), (_, q) in zip(ref.named_parameters(), ddp.module.named_parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-6)  # (2g)/2 = g

    # no_sync: local accumulation, no collective; the next synced backward averages the sum
    comm.log.clear()
    with ddp.no_sync():
        out = ddp(x)
        (out ** 2).mean().backward()
    assert not [e for e in comm.log if e[0] == "iallreduce"]

    # rank 0 writes the checkpoint
    ddp.save_checkpoint(tmp_path / "m.ckpt")
    assert (tmp_path / "m.ckpt").exists()


def test_ddp_rejects_what_is_not_a_model():
    from onemodel.distributed import DistributedDataParallel

    with pytest.raises(DistributedError, match="wraps a Module, not int"):
        DistributedDataParallel(3, TwinComm())
    with pytest.raises(DistributedError, match="bucket_cap_mb must be positive"):
        DistributedDataParallel(_mlp(), TwinComm(), bucket_cap_mb=0)


class SoloComm(TwinComm):
    """A world of one, without starting MPI in the test process."""

    def __init__(self):
        super().__init__()
        self.size = 1


def test_sync_batchnorm_matches_batchnorm_on_one_rank_and_in_eval():
    from onemodel.distributed import SyncBatchNorm, convert_sync_batchnorm

    net = Sequential(BatchNorm2d(3), ReLU())
    net[0].running_mean._data[...] = [0.1, 0.2, 0.3]
    plain = Sequential(BatchNorm2d(3), ReLU())
    plain.load_state_dict(net.state_dict())
    convert_sync_batchnorm(net, SoloComm())
    assert isinstance(net[0], SyncBatchNorm)
    x = Tensor.from_numpy(np.random.default_rng(1).standard_normal((4, 3, 5, 5)).astype(np.float32))
    np.testing.assert_allclose(net(x).numpy(), plain(x).numpy(), rtol=1e-6)  # world of one
    net.eval()
    plain.eval()
    np.testing.assert_allclose(net(x).numpy(), plain(x).numpy(), rtol=1e-6)
    assert list(net.state_dict()) == list(plain.state_dict())
