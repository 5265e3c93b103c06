"""The plugin's hooks (entry point ``numba`` in group ``onemodel``). Registration names code
lazily: discovering this plugin imports neither numba nor a kernel module. Every kernel has a
priority above the reference kernels (0) and a ``supports`` check, so the reference kernel stays
the fallback for whatever a numba kernel does not cover."""

from __future__ import annotations

from onemodel.tensors.registry import hookimpl

PRIORITY = 10
_K = "onemodel.numba"

# op -> (kernel, supports check). Only kernels that measured faster than the reference are
# listed, and each supports check admits only the calls where they did: Softmax/LogSoftmax
# are float32 over the last axis (float64 rows and other axes stay with the reference; see
# docs/benchmarks.md).
KERNELS: dict[str, tuple[str, str]] = {
    "Conv": (f"{_K}.conv:conv", f"{_K}.support:conv"),
    "FusedConv": (f"{_K}.conv:fused_conv", f"{_K}.support:conv"),
    "ConvInputGrad": (f"{_K}.conv:conv_input_grad", f"{_K}.support:conv_grad"),
    "ConvTranspose": (f"{_K}.conv:conv_transpose", f"{_K}.support:conv_transpose"),
    "ConvWeightGrad": (f"{_K}.conv:conv_weight_grad", f"{_K}.support:conv_grad"),
    "BatchNormalization": (f"{_K}.norm:batch_normalization", f"{_K}.support:batch_norm"),
    "LayerNormalization": (f"{_K}.norm:layer_normalization", f"{_K}.support:layer_norm"),
    "RMSNormalization": (f"{_K}.norm:rms_normalization", f"{_K}.support:rms_norm"),
    "SkipLayerNormalization": (f"{_K}.norm:skip_layer_normalization", f"{_K}.support:skip_norm"),
    "ChannelLayerNormalization": (f"{_K}.norm:channel_layer_normalization",
                                  f"{_K}.support:channel_norm"),
    "LRN": (f"{_K}.norm:lrn", f"{_K}.support:lrn"),
    "InstanceNormalization": (f"{_K}.norm:instance_normalization", f"{_K}.support:group_norm"),
    "GroupNormalization": (f"{_K}.norm:group_normalization", f"{_K}.support:group_norm"),
    "Erf": (f"{_K}.activation:erf", f"{_K}.support:unary"),
    "Gelu": (f"{_K}.activation:gelu", f"{_K}.support:unary"),
    "ReluGrad": (f"{_K}.activation:relu_grad", f"{_K}.support:relu_grad"),
    "MaxPool": (f"{_K}.pool:max_pool", f"{_K}.support:pool"),
    "AveragePool": (f"{_K}.pool:average_pool", f"{_K}.support:pool"),
    "MaxPoolGrad": (f"{_K}.pool:max_pool_grad", f"{_K}.support:pool_grad"),
    "AveragePoolGrad": (f"{_K}.pool:average_pool_grad", f"{_K}.support:pool_grad"),
    "GlobalAveragePool": (f"{_K}.pool:global_average_pool", f"{_K}.support:global_pool"),
    "ReduceMean": (f"{_K}.reduction:reduce_mean", f"{_K}.support:reduce_mean"),
    "Softmax": (f"{_K}.softmax:softmax", f"{_K}.support:softmax"),
    "LogSoftmax": (f"{_K}.softmax:log_softmax", f"{_K}.support:softmax"),
    "FusedElementwise": (f"{_K}.fused:fused_elementwise", f"{_K}.support:same_float"),
    "FusedAttention": (f"{_K}.attention:fused_attention", f"{_K}.support:attention"),
    "FusedGemm": (f"{_K}.gemm:fused_gemm", f"{_K}.support:fused_gemm"),
    "Gemm": (f"{_K}.gemm:gemm", f"{_K}.support:gemm"),
    "MatMul": (f"{_K}.gemm:matmul", f"{_K}.support:same_float"),
    "FusedMatMul": (f"{_K}.gemm:fused_matmul", f"{_K}.support:fused_matmul"),
    "Resize": (f"{_K}.resize:resize", f"{_K}.support:resize"),
    "LSTM": (f"{_K}.recurrent:lstm", f"{_K}.support:lstm"),
    "SoftmaxCrossEntropyLoss": (f"{_K}.loss:softmax_cross_entropy_loss",
                                f"{_K}.support:cross_entropy"),
    "SoftmaxCrossEntropyLossGrad": (f"{_K}.loss:softmax_cross_entropy_loss_grad",
                                    f"{_K}.support:cross_entropy"),
    "GRU": (f"{_K}.recurrent:gru", f"{_K}.support:gru"),
}

# optimizer updates: no op of the op set, so registered under names that are not op names.
# onemodel-training's optimizers look them up by name (``impl(param, grad, state..., **hyper)``
# updates in place, see optim.py) and keep their numpy update when none is registered.
UPDATES: dict[str, str] = {"optim.SGD": f"{_K}.optim:sgd", "optim.Adam": f"{_K}.optim:adam"}

# kernels that take ``out=`` (a planned buffer they fill and return; see the hookspec)
WRITES_OUT: set[str] = {"FusedElementwise", "RMSNormalization", "BatchNormalization", "Softmax",
                        "LogSoftmax", "Erf", "Gelu", "MaxPool", "AveragePool", "GlobalAveragePool",
                        "Conv", "FusedConv", "FusedAttention", "FusedGemm", "Gemm", "MatMul",
                        "FusedMatMul", "ChannelLayerNormalization"}


@hookimpl
def onemodel_register_kernels(register) -> None:
    for op, (impl, check) in KERNELS.items():
        register(op, impl, device="cpu", dtypes=("F32", "F64"), priority=PRIORITY,
                 supports=check, writes_out=op in WRITES_OUT)
    for name, impl in UPDATES.items():
        register(name, impl, device="cpu", dtypes=("F32", "F64"), priority=PRIORITY)


@hookimpl
def onemodel_register_passes(register) -> None:
    # after activation fusion (order 60) has taken the Relu that directly follows a Conv or
    # Gemm, before dead-code elimination (70)
    register("elementwise-fusion", "onemodel.runtime.passes.fusion:ElementwiseFusion",
             order=65)
    # after activation fusion (which leaves a Conv followed by an Add alone), before elementwise
    # fusion would take the Add (and its Relu) into a chain; this plugin's 1x1 kernels add Z
    # as they store their output (the reference adds it after, as the Add did)
    register("conv-residual-fusion", "onemodel.runtime.passes.rewrites:ConvResidualFusion",
             order=62)
    # before elementwise fusion would take a MatMul's bias Add and GELU into a chain; this
    # plugin's FusedMatMul adds the bias and applies the activation as one pass over the product
    register("matmul-epilogue-fusion", "onemodel.runtime.passes.rewrites:MatMulEpilogueFusion",
             order=63)
    # before elementwise fusion takes the scores' scale and mask into a chain; the fused node
    # pays off with this plugin's one-pass kernel (the reference runs the same ops in turn)
    register("attention-fusion", "onemodel.runtime.passes.attention:AttentionFusion", order=57)
    # before elementwise fusion takes the residual Add (and its bias Add) into a chain; the
    # fused node pays off with this plugin's kernel (the reference adds, then normalizes)
    register("skip-layer-norm-fusion", "onemodel.runtime.passes.rewrites:SkipLayerNormFusion",
             order=58)
