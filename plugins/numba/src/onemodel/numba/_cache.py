"""numba's on-disk cache of this package, dropped whenever the package's sources change.

numba revalidates a cached function by its own file alone (the file's contents in numba 0.68,
its time stamp before). The kernels here compile functions of other files into their machine
code: ``conv._activate_in_place`` into the tiles of ``tiled.py``, ``pointwise.py`` and
``winograd.py``, for one. An edit or an upgrade that changes ``conv.py`` alone would leave the
tiles' cached machine code valid in numba's eyes, with the old activations in it: a new
activation code would pass through them unapplied, a silently wrong result. (numba's cache
files are not part of an installed package's record, so an upgrade by pip leaves them.)

So the directory numba caches this package in carries a digest of all the package's sources;
on import, before any kernel is loaded, files cached under another digest are removed. The
generated kernels (``_generated``) carry the same digest in their own sources."""

from __future__ import annotations

import os

from numba import njit

from . import _generated

MARK = "onemodel-numba-sources"  # the file, in the cache directory, holding the digest


@njit(cache=True)
def _probe():
    """Never called: numba's cache object for it says where this package's files are cached
    (the same directory for every module of the package)."""
    return 0


def cache_path() -> str | None:
    """The directory numba caches this package's compiled kernels in, or None when numba
    does not say (another numba version) or caches nowhere."""
    return getattr(getattr(_probe, "_cache", None), "_cache_path", None)


def drop_stale(path: str | None = None) -> int:
    """Remove numba's cache files (``*.nbi``, ``*.nbc``) from ``path`` (default
    :func:`cache_path`) unless it is marked with the digest of the sources now installed, then
    mark it so. Returns how many files were removed. Never raises: a cache that cannot be
    cleared or marked is one numba recompiles or rewrites anyway."""
    path = path if path is not None else cache_path()
    if not path or not os.path.isdir(path):
        return 0
    digest = _generated.package_digest()
    mark = os.path.join(path, MARK)
    try:
        with open(mark, encoding="utf-8") as f:
            if f.read().strip() == digest:
                return 0
    except OSError:
        pass  # no mark yet: a cache from before this check, or none
    removed = 0
    try:
        names = os.listdir(path)
    except OSError:
        return 0
    for name in names:
        if name.endswith((".nbi", ".nbc")):
            try:
                os.remove(os.path.join(path, name))
                removed += 1
            except OSError:  # another process removed it first, or it is not ours to remove
                pass
    tmp = f"{mark}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(digest)
        os.replace(tmp, mark)
    except OSError:
        pass
    return removed
