"""Real model architectures, built here from tiny configs with seeded random weights (no downloads:
nothing calls ``from_pretrained``) and exported to ONNX by both PyTorch exporters with dynamic axes.

Vision architectures come from ``transformers`` too (ResNet, ConvNeXt, MobileNetV2 for
classification and DeepLabV3 segmentation, Segformer, ViT, Swin, and YOLOS / DETR for detection);
torchvision's own are in torchvision_models.py, which reuses this module's export and cache.

Exported files are cached under ``$ONEMODEL_TEST_CACHE/realmodels`` (default
``~/.cache/onemodel-tests/realmodels``) in a folder named by a hash of the torch, transformers and
onnxscript versions and of this file, so a later run reuses them and any change re-exports."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

EXPORTERS = ("dynamo", "torchscript")
OPSET = 18


@dataclass(frozen=True)
class Axis:
    """A dynamic input axis: its name in the file and the two sizes the tests run at."""
    name: str
    sizes: tuple[int, int]
    min: int = 1
    max: int = 64


@dataclass(frozen=True)
class Input:
    name: str
    shape: tuple[int | Axis, ...]
    kind: str = "float"  # "float", "ids" (integers below `high`), "mask" (ones then zeros)
    high: int = 100


@dataclass(frozen=True)
class Spec:
    name: str
    make: Callable[[], object]  # a torch.nn.Module taking the inputs positionally, giving tensors
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    slow: bool = False
    # exporter -> axes it makes static (torch.export specializes them), with the reason
    fixed: dict[str, tuple[frozenset[str], str]] = field(default_factory=dict)

    def dynamic(self, exporter: str, axis: int | Axis) -> bool:
        """Whether the file by ``exporter`` keeps this axis dynamic."""
        return isinstance(axis, Axis) and axis.name not in self.fixed.get(exporter,
                                                                          (frozenset(), ""))[0]

    def feeds(self, which: int, exporter: str = "torchscript", seed: int = 0
              ) -> dict[str, np.ndarray]:
        """Inputs at the first (``which=0``) or second set of sizes (axes the exporter made
        static keep the first)."""
        rng = np.random.default_rng(seed + which)
        out = {}
        for inp in self.inputs:
            shape = tuple(d.sizes[which if self.dynamic(exporter, d) else 0]
                          if isinstance(d, Axis) else d for d in inp.shape)
            if inp.kind == "ids":
                out[inp.name] = rng.integers(0, inp.high, shape, dtype=np.int64)
            elif inp.kind == "mask":
                mask = np.ones(shape, np.int64)
                mask[0, shape[1] - max(1, shape[1] // 3):] = 0  # padding at the end of row 0
                out[inp.name] = mask
            else:
                out[inp.name] = rng.standard_normal(shape, dtype=np.float32)
        return out


def _wrap(model, pick: Callable):
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model.eval()

        def forward(self, *args):
            return pick(self.inner, *args)

    return Wrapped().eval()


def _seed():
    import torch

    torch.manual_seed(0)


def _randomize(model) -> None:
    """Weights that make every layer matter: transformers' initializers (std 0.02, zero biases,
    unit norms, fresh batch-norm statistics) leave deep tiny models with outputs near zero, where
    any kernel would agree. Matrices get std 1/sqrt(fan-in), vectors noise around their value,
    batch-norm statistics random values."""
    import torch

    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / max(1, p[0].numel()) ** 0.5)
            else:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_var is not None:
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))


def _tiny_text(cls_config, cls_model, pick, **cfg):
    def make():
        _seed()
        config = cls_config(**cfg)
        config._attn_implementation = "eager"
        model = cls_model(config)
        _randomize(model)
        return _wrap(model, pick)
    return make


B = Axis("batch", (2, 3), min=1, max=16)
S = Axis("seq", (5, 9), min=2, max=32)
H = Axis("height", (32, 48), min=32, max=128)
W = Axis("width", (32, 40), min=32, max=128)


def _specs() -> dict[str, Spec]:
    import transformers as tr

    ids = Input("input_ids", (B, S), "ids")
    mask = Input("attention_mask", (B, S), "mask")
    text = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 64, "max_position_embeddings": 64}
    specs = [
        Spec("bert", _tiny_text(tr.BertConfig, tr.BertModel,
                                lambda m, i, a: m(input_ids=i, attention_mask=a).last_hidden_state,
                                **text),
             (ids, mask), ("last_hidden_state",)),
        Spec("gpt2", _tiny_text(tr.GPT2Config, tr.GPT2LMHeadModel,
                                lambda m, i, a: m(input_ids=i, attention_mask=a,
                                                  use_cache=False).logits,
                                vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64),
             (ids, mask), ("logits",)),
        Spec("llama", _tiny_text(tr.LlamaConfig, tr.LlamaForCausalLM,
                                 lambda m, i, a: m(input_ids=i, attention_mask=a,
                                                   use_cache=False).logits,
                                 **text, num_key_value_heads=1),
             (ids, mask), ("logits",)),
        Spec("t5", _tiny_text(tr.T5Config, tr.T5ForConditionalGeneration,
                              lambda m, i, d: m(input_ids=i, decoder_input_ids=d,
                                                use_cache=False).logits,
                              vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                              num_heads=2, relative_attention_num_buckets=8,
                              relative_attention_max_distance=16, decoder_start_token_id=0),
             (ids, Input("decoder_input_ids", (B, Axis("dec_seq", (3, 6), min=2, max=32)), "ids")),
             ("logits",), slow=True),
        Spec("whisper_encoder", _tiny_text(tr.WhisperConfig, tr.WhisperModel,
                                           lambda m, f: m.encoder(input_features=f).last_hidden_state,
                                           vocab_size=100, num_mel_bins=16, d_model=32,
                                           encoder_layers=2, encoder_attention_heads=2,
                                           decoder_layers=1, decoder_attention_heads=2,
                                           encoder_ffn_dim=64, decoder_ffn_dim=64,
                                           max_source_positions=16, max_target_positions=16,
                                           pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                           decoder_start_token_id=1),
             (Input("input_features", (B, 16, 32)),), ("last_hidden_state",)),
    ]

    def vision(name, cls_config, cls_model, pick, shape, slow=False, fixed=None, **cfg):
        specs.append(Spec(name, _tiny_text(cls_config, cls_model, pick, **cfg),
                          (Input("pixel_values", shape),), ("out",), slow=slow,
                          fixed=fixed or {}))

    spatial = (frozenset({"height", "width"}),
               "torch.export specializes height and width (the exporter writes 32, 32)")

    logits = lambda m, x: m(pixel_values=x).logits
    vision("resnet", tr.ResNetConfig, tr.ResNetForImageClassification, logits, (B, 3, H, W),
           embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="bottleneck",
           num_labels=10)
    vision("convnext", tr.ConvNextConfig, tr.ConvNextForImageClassification, logits, (B, 3, H, W),
           hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=10)
    vision("mobilenet_v2", tr.MobileNetV2Config, tr.MobileNetV2ForImageClassification, logits,
           (B, 3, H, W), depth_multiplier=0.25, image_size=32, num_labels=10, tf_padding=False,
           slow=True)
    vision("deeplabv3_mobilenet_v2", tr.MobileNetV2Config, tr.MobileNetV2ForSemanticSegmentation,
           logits, (B, 3, H, W), depth_multiplier=0.25, image_size=32, num_labels=4, slow=True,
           tf_padding=False, fixed={"dynamo": spatial})
    vision("segformer", tr.SegformerConfig, tr.SegformerForSemanticSegmentation, logits,
           (B, 3, H, W), num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
           hidden_sizes=[8, 16], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
           mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=4, slow=True)
    vision("vit", tr.ViTConfig, tr.ViTForImageClassification, logits, (B, 3, 32, 32),
           image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
           intermediate_size=64, num_labels=10)
    vision("swin", tr.SwinConfig, tr.SwinForImageClassification, logits, (B, 3, 32, 32),
           image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2],
           window_size=2, num_labels=10, slow=True)
    vision("yolos", tr.YolosConfig, tr.YolosForObjectDetection,
           lambda m, x: m(pixel_values=x).pred_boxes, (B, 3, 32, 32), slow=True,
           image_size=[32, 32], patch_size=8, hidden_size=32, num_hidden_layers=2,
           num_attention_heads=2, intermediate_size=64, num_detection_tokens=5, num_labels=3)
    vision("detr", tr.DetrConfig, tr.DetrForObjectDetection,
           lambda m, x: m(pixel_values=x).pred_boxes, (B, 3, H, W), slow=True,
           fixed={"dynamo": spatial}, use_timm_backbone=False, use_pretrained_backbone=False,
           backbone_config=tr.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 16],
                                           depths=[1, 1, 1, 1], layer_type="basic",
                                           out_features=["stage4"]),
           d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
           decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5,
           num_labels=3)
    return {s.name: s for s in specs}


_SPECS: dict[str, Spec] | None = None


@contextlib.contextmanager
def _without_torchvision():
    """transformers and torch.onnx import torchvision when it is installed, and a torchvision
    built for another torch fails on import. These models need none of it: unless a working
    torchvision is already loaded, it is hidden while they are built and exported."""
    if "torchvision" in sys.modules:
        yield
        return
    sys.modules["torchvision"] = None  # find_spec and import then see no torchvision
    try:
        yield
    finally:
        if "torchvision" in sys.modules and sys.modules["torchvision"] is None:
            del sys.modules["torchvision"]


def import_transformers():
    """``transformers``, imported so that a torchvision that cannot load stays out of its way:
    while hidden, transformers records once (its checks are cached) that there is none.
    Call it before anything else imports transformers."""
    with _without_torchvision():
        import transformers
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()
    return transformers


def specs() -> dict[str, Spec]:
    global _SPECS
    if _SPECS is None:
        import_transformers()
        with _without_torchvision():
            _SPECS = _specs()
    return _SPECS


def cache_dir() -> Path:
    """The folder for exported files, named by the versions that shape them."""
    import onnxscript
    import torch
    import transformers

    root = Path(os.environ.get("ONEMODEL_TEST_CACHE") or Path.home() / ".cache" / "onemodel-tests")
    key = hashlib.sha256(" ".join([torch.__version__, transformers.__version__,
                                   onnxscript.__version__]).encode()
                         + Path(__file__).read_bytes()).hexdigest()[:16]
    path = root / "realmodels" / key
    path.mkdir(parents=True, exist_ok=True)
    return path


def exported(name: str, exporter: str) -> Path:
    """The ONNX file of model ``name`` by ``exporter`` ("dynamo" or "torchscript"), exported now
    unless the cache holds it. Written to a temporary name and renamed, so parallel test workers
    never read half a file."""
    path = cache_dir() / f"{name}.{exporter}.onnx"
    if not path.exists():
        with _without_torchvision():
            _export(specs()[name], exporter, path)
    return path


def _export(spec: Spec, exporter: str, path: Path) -> None:
    import torch

    model = spec.make()
    feeds = spec.feeds(0, exporter)
    args = tuple(torch.from_numpy(feeds[i.name]) for i in spec.inputs)
    names = [i.name for i in spec.inputs]
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
    os.close(fd)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                dims = {}
                shapes = []
                for inp in spec.inputs:
                    axes = {}
                    for k, d in enumerate(inp.shape):
                        if spec.dynamic(exporter, d):
                            axes[k] = dims.setdefault(d.name, torch.export.Dim(d.name, min=d.min,
                                                                              max=d.max))
                    shapes.append(axes)
                program = torch.onnx.export(model, args, dynamo=True, input_names=names,
                                            output_names=list(spec.outputs),
                                            dynamic_shapes=(tuple(shapes),), opset_version=OPSET,
                                            external_data=False, verbose=False)
                program.save(tmp, external_data=False)
            else:
                axes = {i.name: {k: d.name for k, d in enumerate(i.shape)
                                 if spec.dynamic(exporter, d)} for i in spec.inputs}
                torch.onnx.export(model, args, tmp, dynamo=False, input_names=names,
                                  output_names=list(spec.outputs), dynamic_axes=axes,
                                  opset_version=OPSET)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
