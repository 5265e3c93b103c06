"""Print the op set as a Markdown table (docs/ops.md embeds it; a test keeps the two in step).

    python scripts/op_table.py            # print the table
    python scripts/op_table.py --write    # replace the table at the end of docs/ops.md
"""

from __future__ import annotations

from onemodel.tensors import OPS


def _attr(name, default) -> str:
    return name if default is None else f"{name}={default!r}"


def table() -> str:
    lines = ["| op | domain | inputs | attributes | gradient |", "|---|---|---|---|---|"]
    for name in sorted(OPS):
        op = OPS[name]
        inputs = ", ".join(
            ("*" if op.variadic and i == op.inputs[-1] else "") + i + ("?" if i in op.optional else "")
            for i in op.inputs
        )
        attrs = ", ".join(_attr(k, v) for k, v in op.attrs.items())
        lines.append(f"| {name} | {op.domain or 'ai.onnx'} | {inputs} | {attrs} | "
                     f"{'yes' if op.differentiable else '—'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if sys.argv[1:] == ["--write"]:
        doc = Path(__file__).resolve().parent.parent / "docs" / "ops.md"
        text = doc.read_text()
        doc.write_text(text[: text.index("| op | domain |")] + table())
    else:
        print(table(), end="")
