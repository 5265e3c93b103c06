"""The spec's full program: train Linear(1, 1) on (0, 1), (1, 3), (2, 5), (3, 7), save a
checkpoint, trace with an example batch of four, save both formats, reload the native file and
run a batch of three, comparing with eager forward.

    python examples/recipe.py        # writes trained.checkpoint, line.onemodel and line.onnx here
"""

from onemodel.runtime import Session
from onemodel.tensors import DType, Generator, Tensor
from onemodel.training import SGD, ActivationScope, Checkpoint, Linear, losses

model = Linear(1, 1, Generator(42))
train_x = Tensor.from_data([0, 1, 2, 3], 4, 1, dtype=DType.F32)
train_y = Tensor.from_data([1, 3, 5, 7], 4, 1, dtype=DType.F32)
optimizer = SGD(model.parameters(), 0.05)
for _step in range(200):
    with ActivationScope():
        optimizer.zero_grad()
        loss = losses.mse(model.forward(train_x), train_y)
        loss.backward()
        optimizer.step()
Checkpoint.save("trained.checkpoint", model)

example = Tensor.zeros(DType.F32, 4, 1)
traced = model.trace(example, "batch", None)
traced.save("line.onemodel")
traced.save_onnx("line.onnx")

session = Session.load("line.onemodel")
inputs = Tensor.from_data([4, 5, 6], 3, 1, dtype=DType.F32)
eager = model.forward(inputs)
outputs = session.run({"input": inputs})
expected = eager.to_array()
actual = outputs["output"].to_array()
print("Eager: " + ", ".join(f"{x:.3f}" for x in expected))
print("Graph: " + ", ".join(f"{x:.3f}" for x in actual))
difference = max(abs(a - b) for a, b in zip(expected, actual))
print(f"Largest difference: {difference:.6f}")
print("Saved line.onemodel and line.onnx")
