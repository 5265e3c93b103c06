"""The plugin's hooks (entry point ``cupy`` in group ``onemodel``): the ``"cuda"`` device and its
kernels. Registration names code lazily (``"module:attr"``): discovering the plugin imports
neither CuPy nor a kernel module, and ``available()`` says False where CuPy or a GPU is missing,
so installing the plugin on a machine without a GPU changes nothing there.

Ops without a kernel here run on the CPU with counted transfers (the core's fallback), so the
table below is what stays on the GPU: the elementwise, reduction, shape, matrix, convolution,
pooling, normalization and softmax ops that inference and training of the common layers use.
"""

from __future__ import annotations

from onemodel.tensors.registry import hookimpl

DEVICE = "cuda"
PRIORITY = 10
_D = "onemodel.cupy.device"
_K = "onemodel.cupy.kernels"
_N = "onemodel.cupy.nn"

FLOAT = ("F16", "F32", "F64")
NUMERIC = FLOAT + ("I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64")
ANY = NUMERIC + ("BOOL",)

# op -> (kernel, dtypes of its first input)
KERNELS: dict[str, tuple[str, tuple[str, ...]]] = {
    # arithmetic and math functions
    "Add": (f"{_K}:add", NUMERIC),
    "Sub": (f"{_K}:sub", NUMERIC),
    "Mul": (f"{_K}:mul", NUMERIC),
    "Div": (f"{_K}:div", NUMERIC),
    "Pow": (f"{_K}:pow_", NUMERIC),
    "Sum": (f"{_K}:sum_", NUMERIC),
    "Max": (f"{_K}:max_", NUMERIC),
    "Min": (f"{_K}:min_", NUMERIC),
    "Neg": (f"{_K}:neg", NUMERIC),
    "Abs": (f"{_K}:abs_", NUMERIC),
    "Sign": (f"{_K}:sign", NUMERIC),
    "Reciprocal": (f"{_K}:reciprocal", FLOAT),
    "Identity": (f"{_K}:identity", ANY),
    "Exp": (f"{_K}:exp", FLOAT),
    "Log": (f"{_K}:log", FLOAT),
    "Sqrt": (f"{_K}:sqrt", FLOAT),
    "Tanh": (f"{_K}:tanh", FLOAT),
    "Erf": (f"{_K}:erf", FLOAT),
    # activations
    "Sigmoid": (f"{_K}:sigmoid", FLOAT),
    "Relu": (f"{_K}:relu", NUMERIC),
    "ReluGrad": (f"{_K}:relu_grad", FLOAT),  # Relu's gradient: training stays on the GPU
    "LeakyRelu": (f"{_K}:leaky_relu", FLOAT),
    "Gelu": (f"{_K}:gelu", FLOAT),
    "Clip": (f"{_K}:clip", NUMERIC),
    # comparisons, logic, selection, conversion
    "Equal": (f"{_K}:equal", ANY),
    "Less": (f"{_K}:less", NUMERIC),
    "LessOrEqual": (f"{_K}:less_or_equal", NUMERIC),
    "Greater": (f"{_K}:greater", NUMERIC),
    "GreaterOrEqual": (f"{_K}:greater_or_equal", NUMERIC),
    "Not": (f"{_K}:not_", ("BOOL",)),
    "And": (f"{_K}:and_", ("BOOL",)),
    "Or": (f"{_K}:or_", ("BOOL",)),
    "Where": (f"{_K}:where", ("BOOL",)),
    "Cast": (f"{_K}:cast", ANY),
    # reductions
    "ReduceSum": (f"{_K}:reduce_sum", NUMERIC),
    "ReduceMean": (f"{_K}:reduce_mean", NUMERIC),
    "ReduceMax": (f"{_K}:reduce_max", NUMERIC),
    "ReduceMin": (f"{_K}:reduce_min", NUMERIC),
    "ArgMax": (f"{_K}:arg_max", NUMERIC),
    "ArgMin": (f"{_K}:arg_min", NUMERIC),
    # shape ops
    "Reshape": (f"{_K}:reshape", ANY),
    "Flatten": (f"{_K}:flatten", ANY),
    "Transpose": (f"{_K}:transpose", ANY),
    "Squeeze": (f"{_K}:squeeze", ANY),
    "Unsqueeze": (f"{_K}:unsqueeze", ANY),
    "Expand": (f"{_K}:expand", ANY),
    "Concat": (f"{_K}:concat", ANY),
    "Slice": (f"{_K}:slice_", ANY),
    "Gather": (f"{_K}:gather", ANY),
    "Shape": (f"{_K}:shape", ANY),
    # matrix products (cuBLAS)
    "MatMul": (f"{_K}:matmul", FLOAT),
    "Gemm": (f"{_K}:gemm", FLOAT),
    "FusedGemm": (f"{_N}:fused_gemm", FLOAT),
    "FusedMatMul": (f"{_N}:fused_matmul", FLOAT),
    # convolution, pooling, normalization, softmax
    "Conv": (f"{_N}:conv", FLOAT),
    "FusedConv": (f"{_N}:fused_conv", FLOAT),
    "MaxPool": (f"{_N}:max_pool", NUMERIC),
    "AveragePool": (f"{_N}:average_pool", FLOAT),
    "GlobalAveragePool": (f"{_N}:global_average_pool", FLOAT),
    "GlobalMaxPool": (f"{_N}:global_max_pool", FLOAT),
    "BatchNormalization": (f"{_N}:batch_normalization", FLOAT),
    "LayerNormalization": (f"{_N}:layer_normalization", FLOAT),
    "ChannelLayerNormalization": (f"{_N}:channel_layer_normalization", FLOAT),
    "Softmax": (f"{_N}:softmax", FLOAT),
    "LogSoftmax": (f"{_N}:log_softmax", FLOAT),
    # the runtime's elementwise chains: one generated CuPy kernel each
    "FusedElementwise": ("onemodel.cupy.fused:fused_elementwise", FLOAT),
}


@hookimpl
def onemodel_register_backends(register) -> None:
    register(DEVICE, description="NVIDIA GPUs through CuPy (onemodel-cupy)",
             available=f"{_D}:available", array_module=f"{_D}:xp",
             to_device=f"{_D}:to_device", to_host=f"{_D}:to_host",
             synchronize=f"{_D}:synchronize", fallback=True)


# supports checks: a call these refuse runs on the host (the reference kernel)
SUPPORTS = {"FusedElementwise": "onemodel.cupy.fused:supports"}


@hookimpl
def onemodel_register_kernels(register) -> None:
    for op, (impl, dtypes) in KERNELS.items():
        register(op, impl, device=DEVICE, dtypes=dtypes, priority=PRIORITY,
                 supports=SUPPORTS.get(op))
