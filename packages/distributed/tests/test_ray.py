"""Batch inference over Ray against one local Session (the oracle), on a local 2-CPU Ray."""

from __future__ import annotations

import os

import numpy as np
import pytest

from onemodel.tensors import Generator, OneModelError, Tensor
from onemodel.training import Linear, ReLU, Sequential

# Ray picks its node address when imported: loopback only, before the import.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

ROWS = 10_000
# Half a CPU per actor: a finished (or failed) dataset's actor pool may hold its CPUs a while
# after, and the next test's actors must still fit in ray.init(num_cpus=2).
CPU = 0.5


@pytest.fixture(scope="module")
def ray_session():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The same MLP saved as .onemodel and as .onnx, plus inputs."""
    model = Sequential(Linear(4, 16, Generator(3)), ReLU(), Linear(16, 2, Generator(4))).eval()
    traced = model.trace(Tensor.from_numpy(np.zeros((8, 4), np.float32)), "batch", None)
    folder = tmp_path_factory.mktemp("models")
    traced.save(folder / "mlp.onemodel")
    traced.save_onnx(folder / "mlp.onnx")
    x = np.random.default_rng(0).standard_normal((ROWS, 4)).astype(np.float32)
    return folder, x


def _local(path, x):
    from onemodel.runtime import Session

    return Session.load(path).run({traced_input(path): x})


def traced_input(path) -> str:
    from onemodel.runtime import Session

    return Session.load(path).inputs[0].name


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onemodel", "onnx"])
def test_dataset_through_two_actors_equals_one_session(ray_session, saved, fmt):
    from onemodel.distributed.ray import map_batches

    folder, x = saved
    path = folder / f"mlp.{fmt}"
    name = traced_input(path)
    want = _local(path, x)
    # several blocks, so both actors work; no other task competes for the 2 CPUs the actors hold
    ds = ray.data.from_numpy([x[i:i + 2500] for i in range(0, ROWS, 2500)])
    out = map_batches(ds, path, batch_size=700, num_actors=2, columns={name: "data"},
                      num_cpus=CPU)
    batches = list(out.iter_batches(batch_size=None, batch_format="numpy"))
    got = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    assert len(got["data"]) == ROWS
    np.testing.assert_array_equal(got["data"], x)  # in order
    for oname, value in want.items():
        np.testing.assert_array_equal(got[oname], value.numpy())


@pytest.mark.slow
def test_plain_iterable_in_order(ray_session, saved):
    from onemodel.distributed.ray import run_batches

    folder, x = saved
    path = folder / "mlp.onemodel"
    name = traced_input(path)
    (oname, want), = _local(path, x).items()
    chunks = [{name: x[i:i + 999]} for i in range(0, ROWS, 999)]
    results = list(run_batches(chunks, path, num_actors=2, output_columns={oname: "y"},
                               num_cpus=CPU, timeout=120))
    assert [len(r["y"]) for r in results] == [len(c[name]) for c in chunks]
    np.testing.assert_array_equal(np.concatenate([r["y"] for r in results]), want.numpy())


@pytest.mark.slow
def test_bad_row_names_input_and_batch(ray_session, saved):
    from onemodel.distributed.ray import map_batches, run_batches

    folder, x = saved
    path = folder / "mlp.onemodel"
    name = traced_input(path)
    rows = [{"id": i, "x": x[i]} for i in range(200)]
    rows[137] = {"id": 137, "x": x[137][:3]}  # one row of the wrong shape
    ds = ray.data.from_items(rows)
    out = map_batches(ds, path, batch_size=50, num_actors=2, columns={name: "x"},
                      index_column="id", num_cpus=CPU)
    with pytest.raises(Exception) as info:
        out.materialize()
    text = str(info.value)
    assert f"input {name!r} (column 'x'): row 137 (the batch of rows 100..149)" in text, text
    assert "of shape [3]" in text and "F32[4]" in text

    chunks = [{name: x[:100]}, {name: x[100:200, :3]}]
    with pytest.raises(OneModelError, match=rf"input '{name}' \(column '{name}'\): row 0 of "
                                            r"batch 1, rows 100\.\.199 is of shape \[3\]"):
        list(run_batches(chunks, path, num_actors=2, num_cpus=CPU, timeout=120))


def test_arguments_checked_before_ray_runs(saved, tmp_path):
    from onemodel.distributed.ray import map_batches, run_batches

    with pytest.raises(OneModelError, match="no such model file"):
        list(run_batches([], tmp_path / "missing.onemodel"))
    with pytest.raises(OneModelError, match="num_actors must be at least 1"):
        map_batches(None, saved[0] / "mlp.onemodel", num_actors=0)


def test_predictor_locally(saved):
    """The per-actor callable on its own: names a missing column and a wrong dtype."""
    from onemodel.distributed.ray import SessionPredictor

    folder, x = saved
    p = SessionPredictor(folder / "mlp.onemodel", columns=None)
    name = p.inputs[0].name
    out = p({name: x[:5]})
    (oname, want), = _local(folder / "mlp.onemodel", x[:5]).items()
    np.testing.assert_array_equal(out[oname], want.numpy())
    with pytest.raises(OneModelError, match=f"input '{name}' reads column '{name}', which the "
                                            "batch lacks"):
        p({"other": x[:5]})
    with pytest.raises(OneModelError, match="of dtype float64"):
        p({name: x[:5].astype(np.float64)})


@pytest.mark.slow
def test_actors_that_cannot_be_placed_time_out(ray_session, saved):
    from onemodel.distributed.ray import run_batches

    folder, x = saved
    name = traced_input(folder / "mlp.onemodel")
    with pytest.raises(OneModelError, match=r"batch 0, rows 0\.\.9 took more than 2 s: are there "
                                            "free CPUs"):
        list(run_batches([{name: x[:10]}], folder / "mlp.onemodel", num_actors=1, num_cpus=8,
                         timeout=2))
