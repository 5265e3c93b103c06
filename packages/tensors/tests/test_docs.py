import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_op_table_in_docs_is_current():
    spec = importlib.util.spec_from_file_location("op_table", ROOT / "scripts" / "op_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.table() in (ROOT / "docs" / "ops.md").read_text(), (
        "docs/ops.md is out of date: regenerate its table with `python scripts/op_table.py`"
    )
