"""Optimization passes. The built-in ones register through ``onemodel_register_passes`` like any
plugin's; ``default_passes()`` lists what the registry holds, in order."""

from .affine import BatchNormToAffine, ConvAffineFolding, MatMulScaleFolding
from .attention import AttentionFusion
from .base import Pass, PassManager
from .channels import ChannelLayerNormFusion
from .cleanup import CommonSubexpressionElimination, DeadCodeElimination, IdentityElimination
from .folding import ConstantFolding
from .rewrites import (
    ActivationFusion,
    BatchNormFolding,
    ConvResidualFusion,
    GemmWeightLayout,
    MatMulAddToGemm,
    MatMulEpilogueFusion,
    RMSNormFusion,
    SkipLayerNormFusion,
)
from .siblings import SiblingMatMulMerge

__all__ = ["ActivationFusion", "AttentionFusion", "BatchNormFolding", "BatchNormToAffine",
           "ChannelLayerNormFusion", "CommonSubexpressionElimination", "ConstantFolding", "ConvAffineFolding",
           "ConvResidualFusion", "DeadCodeElimination", "GemmWeightLayout",
           "IdentityElimination", "MatMulAddToGemm", "MatMulEpilogueFusion",
           "MatMulScaleFolding", "Pass", "PassManager", "RMSNormFusion", "SiblingMatMulMerge",
           "SkipLayerNormFusion"]
