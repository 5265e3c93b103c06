"""The runtime's built-in plugin: adds the runtime's hookspecs and registers the default passes."""

from __future__ import annotations

from onemodel.tensors.registry import hookimpl

from . import hookspecs


@hookimpl
def onemodel_addhooks(pluginmanager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def onemodel_register_passes(register) -> None:
    p = "onemodel.runtime.passes"
    register("identity", f"{p}.cleanup:IdentityElimination", order=10)
    register("constant-folding", f"{p}.folding:ConstantFolding", order=20)
    register("cse", f"{p}.cleanup:CommonSubexpressionElimination", order=30)
    register("batchnorm-folding", f"{p}.rewrites:BatchNormFolding", order=40)
    register("batchnorm-to-affine", f"{p}.affine:BatchNormToAffine", order=41)
    register("conv-affine-folding", f"{p}.affine:ConvAffineFolding", order=42)
    register("matmul-add-to-gemm", f"{p}.rewrites:MatMulAddToGemm", order=50)
    # before sibling-matmul-merge: a query scaled after its bias (Whisper's) is then a plain
    # projection that merges with K and V
    register("matmul-scale-folding", f"{p}.affine:MatMulScaleFolding", order=51)
    register("sibling-matmul-merge", f"{p}.siblings:SiblingMatMulMerge", order=52)
    register("rms-norm-fusion", f"{p}.rewrites:RMSNormFusion", order=55)
    register("channel-layer-norm-fusion", f"{p}.channels:ChannelLayerNormFusion", order=56)
    register("activation-fusion", f"{p}.rewrites:ActivationFusion", order=60)
    register("gemm-weight-layout", f"{p}.rewrites:GemmWeightLayout", order=67)
    register("dead-code", f"{p}.cleanup:DeadCodeElimination", order=70)


@hookimpl
def onemodel_register_commands(register) -> None:
    c = "onemodel.runtime.cli"
    register("inspect", f"{c}.inspect:inspect_command")
    register("run", f"{c}.run:run_command")
    register("convert", f"{c}.convert:convert_command")
    register("check", f"{c}.check:check_command")
    register("bench", f"{c}.bench:bench_command")
    register("plugins", f"{c}.plugins:plugins_command")
