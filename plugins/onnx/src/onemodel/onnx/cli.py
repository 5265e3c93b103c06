"""What only the ONNX plugin can add to the ``onemodel`` command: ``validate`` (the ONNX
checker and shape inference on a file, or on the export of a ``.onemodel``) and the format
details that ``inspect`` prints."""

from __future__ import annotations

import os
import tempfile

import click

from onemodel.runtime import serializers
from onemodel.tensors import OneModelError


def describe(path: str | os.PathLike) -> dict:
    """IR version, opsets and producer of an ONNX file (weights are not read)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # any protobuf failure is a bad file
        raise OneModelError(f"{path}: not a readable ONNX model ({type(exc).__name__})") from None
    opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    return {"ir_version": model.ir_version, "opset": opsets.get("ai.onnx", 0),
            **({"other_opsets": opsets} if len(opsets) > 1 else {}),
            "producer": f"{model.producer_name} {model.producer_version}".strip()}


@click.command("validate")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--opset", type=int, default=None, help="Opset for exporting a .onemodel file.")
def validate_command(model: str, opset: int | None) -> None:
    """Check MODEL against the ONNX specification (onnx.checker with full shape inference).
    A .onemodel file is exported to ONNX first, so this also checks what `convert` would write."""
    import onnx

    path, temporary = model, False
    if serializers.for_loading(model).name != "onnx":
        fd, path = tempfile.mkstemp(suffix=".onnx")
        os.close(fd)
        temporary = True
        serializers.save(serializers.load(model), path, format="onnx",
                         **({} if opset is None else {"opset": opset}))
    try:
        onnx.checker.check_model(path, full_check=True)
        details = describe(path)
    except onnx.checker.ValidationError as exc:
        raise OneModelError(f"{model}: not valid ONNX: {' '.join(str(exc).split())[:500]}") \
            from None
    finally:
        if temporary:
            os.unlink(path)
    click.echo(f"{model}: valid ONNX (IR {details['ir_version']}, opset {details['opset']}"
               + (", as exported" if temporary else "") + ")")
