"""Kernels written as source at run time (one per fused chain, one per depthwise kernel size):
each source goes to a file in numba's cache directory and is imported from there, so numba's
on-disk cache keeps its machine code across processes like that of any other kernel. The source
is made by this package from op attributes and shapes alone, never from text in a model file."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType


def cache_dir() -> str:
    """Where generated sources live: ``$NUMBA_CACHE_DIR/onemodel_fused`` (numba keeps its
    cache of each beside it, in ``__pycache__``)."""
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(tempfile.gettempdir(),
                                                             "onemodel-numba")
    path = os.path.join(base, "onemodel_fused")
    os.makedirs(path, exist_ok=True)
    return path


_built_against: list[str] = []


def package_digest() -> str:
    """A digest of this package's own sources. numba's cache revalidates a function by its
    file's time stamp only, not those of the functions it calls in other files: a generated
    file left unchanged would keep machine code compiled against an older ``_activate`` after
    an upgrade. Its text carries this digest, so it is rewritten (and recompiled) instead."""
    if not _built_against:
        here = Path(__file__).resolve().parent
        digest = hashlib.sha1()
        for path in sorted(here.glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        _built_against.append(digest.hexdigest()[:16])
    return _built_against[0]


def load(name: str, source: str) -> ModuleType:
    """The module ``name`` made of ``source``: the file is (re)written atomically when missing
    or different, so concurrent processes never import half a file. Callers hold their own lock
    and memoize the result."""
    source = f"{source}\n# built against onemodel.numba sources {package_digest()}\n"
    path = os.path.join(cache_dir(), name + ".py")
    if not os.path.exists(path) or Path(path).read_text() != source:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    modname = f"onemodel_numba_generated.{name}"
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    spec.loader.exec_module(module)
    return module
