"""The spec's snippet: load trained.checkpoint (written by examples/recipe.py) into a fresh
Linear(1, 1, Generator(42)), trace it with a batch of four, and save it.

    python examples/snippet.py           # Saved line.onemodel
    python examples/snippet.py --onnx    # the variation: Saved line.onnx
"""

import sys

from onemodel.tensors import DType, Generator, Tensor
from onemodel.training import Checkpoint, Linear

model = Linear(1, 1, Generator(42))
Checkpoint.load("trained.checkpoint", model)
example = Tensor.zeros(DType.F32, 4, 1)
graph = model.trace(example, "batch", None)
if "--onnx" in sys.argv[1:]:
    graph.save_onnx("line.onnx")
    print("Saved line.onnx")
else:
    graph.save("line.onemodel")
    print("Saved line.onemodel")
