"""Reading and writing model files safely, shared by every format (native, ONNX, checkpoints).

Writing: a temporary file in the same folder, fsynced, then renamed over the target, so a crash
or an error leaves the old file as it was. Temporary files are named
``.{name}.onemodel-tmp-{pid}-{n}``; a writer killed outright (SIGKILL, power loss) leaves one
behind, and the next save to the same path removes those whose process is gone.

Reading: limits that bound the memory and time a loader spends on a file before it does the
work (header sizes, node counts, constants built at load time), and a strict JSON reader that
refuses what a writer of ours never produces (``NaN``, ``Infinity``, out-of-range numbers, deep
nesting), so hostile files end in a ``OneModelError``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .errors import OneModelError

_TMP = ".onemodel-tmp-"
_counter = itertools.count()


def atomic_write(path: str | os.PathLike, chunks: Iterable[bytes | memoryview]) -> None:
    """Write ``chunks`` to ``path`` atomically; the file gets the usual mode (0666 & ~umask)."""
    path = Path(path)
    folder = path.parent
    remove_stale_temps(path)
    tmp = folder / f".{path.name}{_TMP}{os.getpid()}-{next(_counter)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(tmp, flags, 0o666)
    except FileExistsError:  # left by a dead process that had our pid
        tmp.unlink()
        fd = os.open(tmp, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(folder)


def remove_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of earlier saves to ``path`` whose writer process is gone."""
    path = Path(path)
    pattern = re.compile(re.escape(f".{path.name}{_TMP}") + r"(\d+)-\d+")
    removed = []
    try:
        entries = list(os.scandir(path.parent if str(path.parent) else "."))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if m and not _alive(int(m.group(1))):
            try:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
            except OSError:
                pass  # another writer removed it, or we may not: leave it
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid() or os.name != "posix":
        return True  # on Windows os.kill(pid, 0) would end the process: never probe there
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True  # exists under another user, or we cannot tell: keep its file
    return True


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder if str(folder) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# limits -----------------------------------------------------------------------------------------

# name -> (default, what it bounds); each can be set by the environment variable ONEMODEL_MAX_<NAME>
LIMITS: dict[str, tuple[int, str]] = {
    "HEADER_BYTES": (64 * 1024 * 1024,
                     "bytes of a .onemodel or checkpoint JSON header (checked before parsing)"),
    "NODES": (300_000, "nodes of a graph read from a file (checked before the graph is built)"),
    # model-zoo VGG-19 builds a 4096 x 25088 weight (103M elements) with ConstantOfShape
    "CONSTANT_ELEMENTS": (1 << 28, "elements of a constant an importer builds from a shape "
                                   "(ONNX ConstantOfShape), checked before allocating"),
}


def load_limit(name: str, override: int | None = None) -> int:
    """The limit ``name`` (a key of ``LIMITS``): ``override``, else ``$ONEMODEL_MAX_<NAME>``,
    else the default."""
    default, _ = LIMITS[name]
    if override is not None:
        return int(override)
    text = os.environ.get(f"ONEMODEL_MAX_{name}")
    if text is None or not text.strip():
        return default
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        raise OneModelError(f"ONEMODEL_MAX_{name}={text!r} is not a whole number; unset it or "
                            f"give a count (default {default})") from None
    if value < 0:
        raise OneModelError(f"ONEMODEL_MAX_{name}={text!r} is negative")
    return value


# strict JSON ------------------------------------------------------------------------------------

_INT_LIMIT = 1 << 63


def _bad_constant(name: str):
    raise OneModelError(f"the JSON holds {name}, which OneModel never writes")


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise OneModelError(f"the JSON holds the number {text[:40]}, which is out of range")
    return value


def _int(text: str) -> int:
    if len(text) > 20:
        raise OneModelError(f"the JSON holds the integer {text[:40]}..., which is out of range")
    value = int(text)
    if not -_INT_LIMIT <= value < _INT_LIMIT:
        raise OneModelError(f"the JSON holds the integer {text}, which is out of range")
    return value


def read_json(raw: bytes | memoryview | str, what: str = "header", *,
              allow_nonfinite: bool = False) -> Any:
    """Parse JSON written by OneModel, refusing integers outside the 64-bit range, nesting deeper
    than Python's recursion limit and invalid UTF-8 with a ``OneModelError``; NaN, Infinity
    and floats that overflow (``1e400``) too unless ``allow_nonfinite`` (float attributes may
    legitimately be infinite)."""
    try:
        text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8")
        if allow_nonfinite:
            return json.loads(text, parse_int=_int)
        return json.loads(text, parse_constant=_bad_constant, parse_float=_float,
                          parse_int=_int)
    except OneModelError as exc:
        raise OneModelError(f"corrupt {what}: {exc}") from None
    except RecursionError:
        raise OneModelError(f"corrupt {what}: JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError too
        raise OneModelError(f"corrupt {what}: not valid JSON ({type(exc).__name__}: "
                            f"{str(exc)[:200]})") from None
