"""The networks the tracing tests trace (built with onemodel.training)."""

from onemodel.tensors import Generator
from onemodel.training import (
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    Linear,
    MaxPool2d,
    ReLU,
    Sequential,
    TransformerEncoderLayer,
)


def mlp():
    g = Generator(0)
    return Sequential(Linear(12, 32, g), ReLU(), Dropout(0.2), Linear(32, 32, g), ReLU(),
                      Linear(32, 5, g))


def cnn():
    g = Generator(1)
    net = Sequential(Conv2d(3, 8, 3, padding=1, generator=g), BatchNorm2d(8), ReLU(),
                     MaxPool2d(2), Dropout(0.3), Conv2d(8, 8, 3, padding=1, generator=g),
                     BatchNorm2d(8), ReLU(), MaxPool2d(2), Flatten(), Linear(8 * 2 * 2, 4, g))
    # non-trivial running statistics, as after training
    for i, bn in ((1, net[1]), (6, net[6])):
        bn.running_mean.numpy()[:] = Generator(i).normal((8,), 0, 0.1)
        bn.running_var.numpy()[:] = Generator(i + 1).uniform((8,), 0.5, 1.5)
    return net


def encoder():
    return TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True, generator=Generator(2))
