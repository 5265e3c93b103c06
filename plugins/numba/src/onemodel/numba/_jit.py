"""The numba side shared by every kernel module: the decorator (on-disk cache on, compiled
lazily per dtype signature), serial or parallel per call, and the thread count kept in step with
``onemodel.tensors.threads``. Importing this module imports numba; the plugin's hook module
never does.

OpenMP workers must sleep, not spin, between kernels: most kernels run serially, the BLAS runs
its own threads on the same cores, and a spinning worker takes a core from them. libgomp reads
``OMP_WAIT_POLICY`` once, when it is loaded, so this module sets it to ``PASSIVE`` (unless the
user set it) before numba can load libgomp. When another library (PyTorch) loaded libgomp first,
that is too late: numba's OpenMP threading layer would share that libgomp and its workers would
spin after every parallel kernel. Then numba is steered to a threading layer that is not
OpenMP (TBB where installed, else its own workqueue, whose workers block between kernels).

On x86, numba's code generation is told to prefer no vector gathers and scatters
(:func:`_prefer_no_gathers`): LLVM's cost model for AMD's Zen 4 takes AVX-512 gathers for
cheap, and a kernel's loop vectorized with them ran 3.4x slower than the same loop without
(docs/benchmarks.md, "Twenty-fourth round"), and on a CPU with AVX-512 to keep 512-bit
vectors whole (``-prefer-256-bit``, :data:`WIDE_VECTORS`) for the sixteen-lane kernels."""

from __future__ import annotations

import os
import platform
import threading
import types

_POLICY = "OMP_WAIT_POLICY"


def _libgomp_loaded() -> bool:
    """Whether an OpenMP runtime of the GNU kind is mapped into this process already."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return any("libgomp" in line for line in f)
    except OSError:  # not Linux: no /proc; libgomp is a Linux runtime anyway
        return False


# True: numba must not use its OpenMP layer (libgomp loaded before we could make it passive)
AVOID_OPENMP = _libgomp_loaded() and os.environ.get(_POLICY, "").strip().upper() != "PASSIVE"
os.environ.setdefault(_POLICY, "PASSIVE")

import numba  # noqa: E402
from onemodel.tensors import threads  # noqa: E402
from onemodel.tensors.ops.specialize import Constant, Direct, Input, Output, Planned  # noqa: E402

# LLVM tuning features (not instruction sets): the machine code stays valid for the host
PREFER_NO_GATHERS = ("+prefer-no-gather", "+prefer-no-scatter")
# LLVM prefers 256-bit vectors on Intel's AVX-512 CPUs (a clock-speed concern of their first
# generations), and then splits the sixteen-lane kernels' vectors (_simd.F32x16) into halves
WHOLE_512_BIT = "-prefer-256-bit"


def _prefer_no_gathers() -> bool:
    """Add :data:`PREFER_NO_GATHERS` to the CPU features numba generates code for, on x86, when
    numba generates no code in this process yet and the user chose neither features nor a CPU
    (``NUMBA_CPU_FEATURES``, ``NUMBA_CPU_NAME``: setting either opts out), and on a CPU with
    AVX-512 :data:`WHOLE_512_BIT` too. Why: on AMD's Zen 4 LLVM vectorized a MaxPool's taps
    over 16 output columns with ``vgatherqps`` and ``vscatterdps`` (47.9 us; 14.0 us without,
    12.4 us on 15 columns, which it left scalar); LLVM sets these features itself for the
    Intel CPUs whose gathers are slow. On Intel's AVX-512 server CPUs LLVM prefers 256-bit
    vectors and splits the sixteen-lane kernels' in two; kept whole, those kernels took the
    real-model suite from 1.21-1.25x onnxruntime to 1.12x on an Emerald Rapids
    (docs/benchmarks.md, "Twenty-fifth round"). The features are part of numba's cache key,
    so machine code cached without them is not reused. Returns whether they were added."""
    from numba.core import codegen, config
    from numba.core.registry import cpu_target

    if config.CPU_FEATURES is not None or config.CPU_NAME is not None or \
            "_toplevel_target_context" in vars(cpu_target):  # code generation under way
        return False
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    features = codegen.get_host_cpu_features()
    if not features:
        return False
    added = PREFER_NO_GATHERS
    if "+avx512f" in features.split(","):
        added += (WHOLE_512_BIT,)
    config.CPU_FEATURES = ",".join((features, *added))
    return True


PREFERS_NO_GATHERS = _prefer_no_gathers()  # before this package's first numba function
# whether 512-bit vectors stay whole in the code numba generates (the sixteen-lane kernels are
# chosen only then: _simd.host_has_avx512)
WIDE_VECTORS = WHOLE_512_BIT in (numba.config.CPU_FEATURES or "").split(",")

from . import _cache  # noqa: E402

# before any kernel module's machine code is loaded: files cached from other sources go
_cache.drop_stale()

if AVOID_OPENMP and numba.config.THREADING_LAYER == "default":
    # read when numba's pool starts (the first parallel call or set_num_threads), not before;
    # numba wants every layer named, so OpenMP goes last (workqueue is always there)
    numba.config.THREADING_LAYER_PRIORITY = [
        *(layer for layer in numba.config.THREADING_LAYER_PRIORITY if layer != "omp"), "omp"]

_applied = -1
_launched = False  # numba's thread pool started (by a setting above one thread)
_parallel = False  # more than one thread: parallel variants are worth their start-up
# the workqueue layer aborts the process when two threads launch parallel kernels at once; with
# it, a parallel kernel runs only while it holds this lock (another caller runs serially)
_exclusive: threading.Lock | None = None
# bytes touched below which a kernel runs serially even with threads to spare
PARALLEL_MIN_BYTES = 1 << 18


def _renamed(fn, suffix: str):
    """``fn`` under another qualified name. numba's on-disk cache keys a function by its name,
    source line, bytecode and signature, not by its compile options: compiled from one
    function, the serial and the parallel variant would load each other's machine code (the
    serial variant then started OpenMP regions). A name per variant keeps their entries apart."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    copy.__qualname__ = f"{fn.__qualname__}__{suffix}"
    copy.__module__ = fn.__module__
    copy.__doc__ = fn.__doc__
    return copy


def jit(parallel: bool = False, fastmath=False):
    """``numba.njit`` with the on-disk cache (``NUMBA_CACHE_DIR``) and the GIL released. With
    ``parallel``, a serial and a parallel (``prange``) variant, chosen per call by size.
    ``fastmath`` (a set of LLVM flags, e.g. ``{"reassoc"}``) lets a float reduction run in
    vector lanes; kernels pass only flags that keep NaN and infinity semantics."""
    def wrap(fn):
        opts = dict(cache=True, nogil=True, error_model="numpy", fastmath=fastmath)
        if not parallel:
            return numba.njit(**opts)(fn)
        return _Dual(numba.njit(**opts)(_renamed(fn, "serial")),
                     numba.njit(parallel=True, **opts)(_renamed(fn, "parallel")), fn)
    return wrap


def dual(serial, parallel, fastmath=False):
    """What ``jit(parallel=True)`` makes of one function, from two: ``serial`` compiled
    serially, ``parallel`` with ``prange`` loops, when their loops are best written apart (a
    generated chain's nested loops against its one parallel loop over every row)."""
    opts = dict(cache=True, nogil=True, error_model="numpy", fastmath=fastmath)
    return _Dual(numba.njit(**opts)(serial), numba.njit(parallel=True, **opts)(parallel),
                 parallel)


class _Dual:
    """A kernel compiled twice: serially for small calls and one thread, in parallel else."""

    def __init__(self, serial, parallel, py_func):
        self.serial = serial
        self.parallel = parallel
        self.py_func = py_func

    def __call__(self, *args):
        if _parallel:
            size = 0
            for a in args:
                size += getattr(a, "nbytes", 0)
            if size >= PARALLEL_MIN_BYTES:
                lock = _exclusive
                if lock is None:
                    return self.parallel(*args)
                if lock.acquire(blocking=False):
                    try:
                        return self.parallel(*args)
                    finally:
                        lock.release()
        return self.serial(*args)


def entry(kernel, args):
    """The machine code of the numba function ``kernel`` for the types of ``args``, called
    without numba's dispatch: a plan's call site that checks its arrays' dtype, rank and
    contiguity, that its output is writeable (and passes the same constants) each call resolves
    it once, at its first call, and saves the typing of every argument on each later one
    (70-190 ns an argument; 0.46 against 0.20 us for a call of 14 arguments). Never for arrays
    of another dtype, rank or layout than these, nor a read-only output: numba's entry checks
    only the item size, so such an array would be read with the wrong steps or written
    regardless."""
    return kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))


def direct(kernel, arguments: tuple, known: tuple, out):
    """A compiled plan's direct call (``Direct``, see onemodel.tensors.ops.specialize) of the
    numba function ``kernel``: its machine code for the types the plan proves. ``arguments``
    holds ``Input`` and ``Output`` markers and the call's other arguments; each marked array
    must be a planned buffer or a constant (``known``, ``out``), so its dtype, rank and layout
    are the ones typed here at every run (what :func:`entry` requires)."""
    types_ = []
    for a in arguments:
        if type(a) is Input:
            fact = known[a.index]
        elif type(a) is Output:
            fact = out  # (another output is of the first one's shape and dtype too)
        else:
            types_.append(kernel.typeof_pyval(a))
            continue
        if type(fact) is Constant:
            value = fact.value if a.shape is None else fact.value.reshape(a.shape)
            types_.append(kernel.typeof_pyval(value))
            continue
        if type(fact) is not Planned:  # a site's mistake: it must check before it offers
            raise TypeError(f"a direct call's array must be planned or constant, not {fact!r}")
        rank = len(fact.shape if a.shape is None else a.shape)
        types_.append(numba.types.Array(numba.from_dtype(fact.dtype), rank, "C"))
    return Direct(kernel.compile(tuple(types_)), tuple(arguments))


def bind(slot: list, kernel, args):
    """``slot[0] = entry(kernel, args)``, returned: a call site's first call binds it, as in
    ``(slot[0] or bind(slot, kernel, args))(*args)``."""
    slot[0] = run = entry(kernel, args)
    return run


def pick(kernel):
    """A dual kernel's serial variant with one thread (what ``_Dual.__call__`` would choose,
    without its per-call sum of the arguments' sizes), the dual kernel itself else."""
    return kernel if _parallel else kernel.serial


def sync_threads() -> None:
    """Size numba's pool to the process's thread setting, when that setting changed. With one
    thread only serial variants run, so the pool is not even started."""
    global _applied, _parallel, _launched, _exclusive
    if _applied != threads.generation or _applied < 0:
        n = min(threads.num_threads(), numba.config.NUMBA_NUM_THREADS)
        if n > 1:
            numba.set_num_threads(n)
            _launched = True
            if numba.threading_layer() == "workqueue" and _exclusive is None:
                _exclusive = threading.Lock()
        elif _launched:
            numba.set_num_threads(1)
        _parallel = n > 1
        _applied = threads.generation
