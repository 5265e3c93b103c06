"""The pytest parameters of a real-model suite (builders.py, torchvision_models.py)."""

from __future__ import annotations

import pytest
from builders import EXPORTERS, Spec


def cases(model_specs: dict[str, Spec], xfail: dict[tuple[str, str], str]):
    """(name, exporter) for every model and exporter: the slow ones marked ``slow_models``, the
    ``xfail`` ones strict, so one that starts passing shows."""
    for name, spec in model_specs.items():
        for exporter in EXPORTERS:
            marks = [pytest.mark.torch]
            if spec.slow:
                marks.append(pytest.mark.slow_models)
            if (name, exporter) in xfail:
                marks.append(pytest.mark.xfail(strict=True, reason=xfail[name, exporter]))
            yield pytest.param(name, exporter, marks=marks, id=f"{name}-{exporter}")
