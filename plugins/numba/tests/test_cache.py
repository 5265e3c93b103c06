"""numba's on-disk cache of the plugin follows every source file of the package
(onemodel.numba._cache): a change to ``conv.py`` alone reaches the kernels of other files that
compiled its functions into their machine code, which numba by itself would keep (it
revalidates a cached function by that function's own file only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onemodel.numba import _cache, _generated, conv
from onemodel.numba._simd import host_has_fma


def test_the_cache_checked_is_the_one_the_kernels_use():
    assert _cache.cache_path() is not None
    assert _cache.cache_path() == conv._activate_in_place._cache._cache_path


def test_files_cached_from_other_sources_are_removed_and_the_directory_marked(tmp_path):
    stale = ["conv._activate-340.py311.nbi", "conv._activate-340.py311.1.nbc"]
    for name in [*stale, "keep.txt"]:
        (tmp_path / name).write_text("x")
    (tmp_path / _cache.MARK).write_text("sources of another version")
    assert _cache.drop_stale(str(tmp_path)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([_cache.MARK, "keep.txt"])
    assert (tmp_path / _cache.MARK).read_text() == _generated.package_digest()
    # marked with the sources installed: what is cached now stays
    (tmp_path / stale[0]).write_text("x")
    assert _cache.drop_stale(str(tmp_path)) == 0
    assert (tmp_path / stale[0]).exists()


def test_a_cache_without_a_mark_is_removed(tmp_path):
    """A cache written before this check (no mark) may be stale too."""
    (tmp_path / "tiled._tiles-162.py311.nbi").write_text("x")
    assert _cache.drop_stale(str(tmp_path)) == 1
    assert _cache.drop_stale(str(tmp_path / "missing")) == 0


_PROBE = """
import numpy as np
from onemodel.numba import pointwise
assert pointwise.__file__.startswith({root!r}), pointwise.__file__
x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(1, 8, 1, 1)
wp, bp = pointwise.packed_weights(np.eye(8, dtype=np.float32).reshape(8, 8, 1, 1), None)
y = np.empty((1, 8, 1, 1), np.float32)
pointwise.channel_lanes(x, wp, bp, 6, y)  # the identity, then Silu (conv.py's)
print(" ".join(repr(float(v)) for v in y.ravel()))
"""


@pytest.mark.skipif(not host_has_fma(), reason="the channel lanes need AVX2 and FMA")
def test_a_change_to_conv_alone_reaches_kernels_of_other_files(tmp_path):
    """A copy of the package runs pointwise.py's channel lanes with activation Silu (compiled
    from conv.py into them, then cached); conv.py alone is changed, as an upgrade may; the
    next process computes with the new conv.py, not the lanes' cached machine code."""
    root = tmp_path / "site"
    package = root / "onemodel" / "numba"
    shutil.copytree(Path(_cache.__file__).parent, package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [
        os.environ.get("PYTHONPATH")])])}
    env.pop("NUMBA_CACHE_DIR", None)  # the copy's own __pycache__

    def run() -> list[float]:
        out = subprocess.run([sys.executable, "-c", _PROBE.format(root=str(root))], env=env,
                             capture_output=True, text=True, timeout=600, check=True)
        return [float(v) for v in out.stdout.split()]

    before = run()
    source = package / "conv.py"
    text = source.read_text()
    old = "return lambda v, zero: v * sigmoid32(v)"
    assert old in text
    source.write_text(text.replace(old, "return lambda v, zero: v * sigmoid32(v) * v"))
    after = run()
    assert any(b != 0 for b in before)
    assert after == pytest.approx([b * x for b, x in zip(before, [
        -3 + 6 * k / 7 for k in range(8)])], rel=1e-5, abs=1e-6)
