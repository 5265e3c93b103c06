"""The spec's training loop: Linear(1, 1, Generator(42)), SGD 0.05, 200 steps of mse under
ActivationScope, learns y = 2x + 1; the checkpoint loads into a fresh layer."""

from onemodel.tensors import DType, Generator, Tensor
from onemodel.training import SGD, ActivationScope, Checkpoint, Linear, losses


def test_spec_training_loop_and_checkpoint(tmp_path):
    model = Linear(1, 1, Generator(42))
    train_x = Tensor.from_data([0, 1, 2, 3], 4, 1, dtype=DType.F32)
    train_y = Tensor.from_data([1, 3, 5, 7], 4, 1, dtype=DType.F32)
    optimizer = SGD(model.parameters(), 0.05)
    for _ in range(200):
        with ActivationScope():
            optimizer.zero_grad()
            loss = losses.mse(model.forward(train_x), train_y)
            loss.backward()
            optimizer.step()
    path = tmp_path / "trained.checkpoint"
    Checkpoint.save(path, model)
    out = model.forward(Tensor.from_data([4, 5, 6], 3, 1, dtype=DType.F32)).to_array()
    for got, want in zip(out, [9, 11, 13]):
        assert abs(got - want) < 0.01
    fresh = Linear(1, 1, Generator(42))
    Checkpoint.load(path, fresh)
    assert fresh.forward(Tensor.from_data([4, 5, 6], 3, 1)).to_array() == out
