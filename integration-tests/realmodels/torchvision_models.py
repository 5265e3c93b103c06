"""torchvision's architectures for the real-model suite, built with random weights (``weights=None``,
no downloads) and exported by both PyTorch exporters like the transformers models (builders.py).

torchvision 0.29.1 is installed without its dependencies beside this machine's torch (its release
for this torch is not on the disk), so its compiled extension does not load and ``import
torchvision`` fails at its first op registration. ``load_torchvision`` declares the two ops it
registers fakes for (``nms``, ``qnms``) first, and gives ``nms`` a CPU kernel written in torch,
which detection models call after their heads; the model definitions are plain Python."""

from __future__ import annotations

import hashlib
from pathlib import Path

import builders
from builders import Axis, Input, Spec

_LIB = None


def load_torchvision():
    """``import torchvision`` with its compiled ops declared here (once per process)."""
    global _LIB
    import torch

    if _LIB is None:
        _LIB = torch.library.Library("torchvision", "DEF")
        _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIB.impl("nms", _nms, "CPU")
    import torchvision

    return torchvision


def _nms(boxes, scores, iou_threshold: float):
    """Greedy non-maximum suppression (torchvision's semantics): indices of kept boxes by
    decreasing score."""
    import torch

    order = torch.argsort(scores, descending=True, stable=True)
    x1, y1, x2, y2 = boxes.unbind(1)
    area = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    keep = []
    suppressed = torch.zeros(len(scores), dtype=torch.bool)
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        xx1 = torch.maximum(x1[i], x1)
        yy1 = torch.maximum(y1[i], y1)
        xx2 = torch.minimum(x2[i], x2)
        yy2 = torch.minimum(y2[i], y2)
        inter = (xx2 - xx1).clamp(min=0) * (yy2 - yy1).clamp(min=0)
        iou = inter / (area[i] + area - inter)
        suppressed |= iou > iou_threshold
    return torch.tensor(keep, dtype=torch.int64)


B = Axis("batch", (2, 3), min=1, max=16)  # not 1 first: torch.export specializes size 1
H = Axis("height", (64, 96), min=32, max=256)
W = Axis("width", (64, 80), min=32, max=256)
_SPATIAL = (frozenset({"height", "width"}),
            "torch.export specializes height and width of this model")


def _classifier(factory, **kwargs):
    def make():
        import torch

        tv = load_torchvision()
        torch.manual_seed(0)
        model = getattr(tv.models, factory)(weights=None, **kwargs)
        builders._randomize(model)
        return builders._wrap(model, lambda m, x: m(x))
    return make


def _segmenter(factory, **kwargs):
    def make():
        import torch

        tv = load_torchvision()
        torch.manual_seed(0)
        model = getattr(tv.models.segmentation, factory)(weights=None, weights_backbone=None,
                                                         **kwargs)
        builders._randomize(model)
        return builders._wrap(model, lambda m, x: m(x)["out"])
    return make


def _vit():
    import torch

    # nn.MultiheadAttention's inference fast path is one fused aten op neither exporter knows
    torch.backends.mha.set_fastpath_enabled(False)
    tv = load_torchvision()
    torch.manual_seed(0)
    model = tv.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                        hidden_dim=32, mlp_dim=64, num_classes=10)
    builders._randomize(model)
    return builders._wrap(model, lambda m, x: m(x))


def _specs() -> dict[str, Spec]:
    image = (Input("images", (B, 3, H, W)),)
    fixed_image = (Input("images", (B, 3, 64, 64)),)
    specs = [
        Spec("tv_resnet18", _classifier("resnet18", num_classes=10), image, ("logits",)),
        Spec("tv_mobilenet_v3_small", _classifier("mobilenet_v3_small", num_classes=10), image,
             ("logits",)),
        Spec("tv_shufflenet_v2", _classifier("shufflenet_v2_x0_5", num_classes=10), image,
             ("logits",), slow=True),
        Spec("tv_squeezenet", _classifier("squeezenet1_1", num_classes=10), image, ("logits",),
             slow=True),
        Spec("tv_efficientnet_b0", _classifier("efficientnet_b0", num_classes=10), image,
             ("logits",), slow=True),
        Spec("tv_mnasnet", _classifier("mnasnet0_5", num_classes=10), image, ("logits",),
             slow=True),
        Spec("tv_regnet", _classifier("regnet_y_400mf", num_classes=10), image, ("logits",),
             slow=True),
        Spec("tv_densenet121", _classifier("densenet121", num_classes=10), image, ("logits",),
             slow=True),
        Spec("tv_convnext_tiny", _classifier("convnext_tiny", num_classes=10), fixed_image,
             ("logits",), slow=True),
        Spec("tv_swin_t", _classifier("swin_t", num_classes=10), fixed_image, ("logits",),
             slow=True),
        Spec("tv_vit", _vit, (Input("images", (B, 3, 32, 32)),), ("logits",)),
        Spec("tv_lraspp_mobilenet_v3", _segmenter("lraspp_mobilenet_v3_large", num_classes=3),
             image, ("out",), fixed={"dynamo": _SPATIAL}),
        Spec("tv_deeplabv3_mobilenet_v3", _segmenter("deeplabv3_mobilenet_v3_large",
                                                     num_classes=3),
             image, ("out",), slow=True, fixed={"dynamo": _SPATIAL}),
        Spec("tv_fcn_resnet50", _segmenter("fcn_resnet50", num_classes=3), image, ("out",),
             slow=True, fixed={"dynamo": _SPATIAL}),
    ]
    return {s.name: s for s in specs}


_SPECS: dict[str, Spec] | None = None


def specs() -> dict[str, Spec]:
    global _SPECS
    if _SPECS is None:
        _SPECS = _specs()
    return _SPECS


def exported(name: str, exporter: str) -> Path:
    """The ONNX file of ``name`` by ``exporter``, from the cache or exported now (atomically)."""
    tv = load_torchvision()
    key = hashlib.sha256(tv.__version__.encode() + Path(__file__).read_bytes()).hexdigest()[:12]
    folder = builders.cache_dir() / f"torchvision-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.{exporter}.onnx"
    if not path.exists():
        builders._export(specs()[name], exporter, path)
    return path


def _enable_nms_export(tv) -> None:
    """torchvision's ``nms`` asks for its compiled extension before it calls the op (declared by
    ``load_torchvision``), and its TorchScript-exporter symbolic (ONNX NonMaxSuppression) is
    registered with the extension: both are done here."""
    from torchvision import extension
    from torchvision.ops import _register_onnx_ops

    def _has_ops() -> bool:  # a plain function: torchvision scripts it
        return True

    extension._has_ops = _has_ops
    _register_onnx_ops._register_custom_op()


def exported_detector() -> Path:
    """SSDLite (MobileNetV3 backbone, random weights, every box kept before NMS) exported by the
    TorchScript exporter with dynamic height and width, NMS included (ONNX NonMaxSuppression):
    outputs boxes, scores, labels, whose count only the data decides. The dynamo exporter has
    no translation for torchvision's nms without its compiled extension."""
    import os
    import tempfile
    import warnings

    import torch

    tv = load_torchvision()
    key = hashlib.sha256(tv.__version__.encode() + Path(__file__).read_bytes()).hexdigest()[:12]
    folder = builders.cache_dir() / f"torchvision-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tv_ssdlite.torchscript.onnx"
    if path.exists():
        return path
    _enable_nms_export(tv)
    torch.manual_seed(0)
    model = tv.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=3, score_thresh=0.0).eval()
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=folder)
    os.close(fd)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, ([torch.rand(3, 64, 64)],), tmp, dynamo=False,
                              opset_version=builders.OPSET, input_names=["image"],
                              output_names=["boxes", "scores", "labels"],
                              dynamic_axes={"image": {1: "height", 2: "width"}})
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
