"""Run ONNX's backend node-test suite against OneModel and onnxruntime on the same harness and
print the pass counts (and OneModel's outcomes by kind).

    python scripts/onnx_conformance.py [--list-failures]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration-tests" / "onnx"))

from conformance import node_cases, onemodel_runner, onnxruntime_runner, run_case, supported


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list-failures", action="store_true")
    args = parser.parse_args()
    cases = node_cases()
    ours = [run_case(c, onemodel_runner()) for c in cases]
    theirs = [run_case(c, onnxruntime_runner()) for c in cases]
    in_set = [c for c in cases if supported(c.model)]
    passed_in_set = sum(o.status == "passed" for c, o in zip(cases, ours) if supported(c.model))
    print(f"cases: {len(cases)}; all ops in OneModel's op set: {len(in_set)}")
    print(f"OneModel passes    {sum(o.status == 'passed' for o in ours):5d} "
          f"({passed_in_set} of the {len(in_set)} in its op set)")
    print(f"onnxruntime passes {sum(o.status == 'passed' for o in theirs):5d}")
    kinds = collections.Counter(o.status for o in ours)
    print("OneModel outcomes:", dict(kinds))
    if args.list_failures:
        for c, o in zip(cases, ours):
            if o.status != "passed" and supported(c.model):
                print(f"  {o.name}: {o.detail}")


if __name__ == "__main__":
    main()
