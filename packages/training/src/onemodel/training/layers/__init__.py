"""The layers, one family per module."""

from .activation import (
    ELU,
    GELU,
    Dropout,
    Embedding,
    Hardsigmoid,
    Hardswish,
    LeakyReLU,
    LogSoftmax,
    Mish,
    PReLU,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Tanh,
)
from .attention import (
    MultiheadAttention,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from .container import ModuleList, Sequential
from .conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
from .linear import Flatten, Identity, Linear
from .normalization import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from .pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AvgPool1d,
    AvgPool2d,
    MaxPool1d,
    MaxPool2d,
)
from .recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from .resample import Upsample, UpsamplingBilinear2d, UpsamplingNearest2d

__all__ = ["ELU", "GELU", "Hardsigmoid", "Hardswish", "LeakyReLU", "LogSoftmax", "Mish", "PReLU",
           "SiLU", "Softplus", "AdaptiveAvgPool2d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Conv1d",
           "Conv2d", "ConvTranspose2d", "Dropout", "Embedding", "Flatten", "GroupNorm",
           "Identity", "LayerNorm", "Linear", "MaxPool2d", "ModuleList", "MultiheadAttention",
           "ReLU", "Sequential", "Sigmoid", "Softmax", "Tanh", "TransformerEncoderLayer",
           "AdaptiveAvgPool1d", "AvgPool1d", "ConvTranspose1d", "MaxPool1d",
           "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder",
           "GRU", "GRUCell", "LSTM", "LSTMCell", "RNN", "RNNCell",
           "Upsample", "UpsamplingBilinear2d", "UpsamplingNearest2d"]
