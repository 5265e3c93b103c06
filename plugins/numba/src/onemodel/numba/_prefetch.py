"""A software prefetch for numba kernels: ``prefetch(a, i)`` asks the memory system for the
cache line holding ``a[i]`` (``a`` 1-D and contiguous) and returns at once; it never faults,
reads nothing into the program and changes no result.

Why: a kernel that streams weights too large to stay in cache between runs (a 1x1 convolution
or a Linear layer over a few rows) waits on memory for each new block. The hardware prefetcher
follows long runs; the skinny product's blocks of four short rows read it as four short runs,
which it barely starts on. Asked a few blocks ahead into L2 (locality 2: ``prefetcht1``), the
lines arrive while the block before is multiplied: 1280 x 320 weights times 8 columns with
the weights out of cache 212-220 -> 124-154 us, 1152 x 192 133-135 -> 64-75 us
(``python benchmarks/planned_calls.py``; docs/benchmarks.md, "Eighteenth round"). Into L1
(locality 3) it measured no gain in a scratch timing: the early requests then crowd the loads
the multiply waits on."""

from __future__ import annotations

from llvmlite import ir

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I8P = ir.IntType(8).as_pointer()
# llvm.prefetch is overloaded on its pointer type: its name carries that type, which is i8*
# under typed pointers (p0i8) and plain ptr under opaque ones (p0)
_NAME = "llvm.prefetch.p0" if getattr(_I8P, "is_opaque", False) else "llvm.prefetch.p0i8"
_I32 = ir.IntType(32)
LOCALITY = 2  # 0: no temporal locality ... 3: keep in every level


def _prefetch_codegen(locality: int):
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        at = builder.gep(ary.data, [args[1]])
        fnty = ir.FunctionType(ir.VoidType(), [_I8P, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, _NAME)
        # (read, locality, data cache)
        builder.call(fn, [builder.bitcast(at, _I8P), ir.Constant(_I32, 0),
                          ir.Constant(_I32, locality), ir.Constant(_I32, 1)])
        return context.get_dummy_value()
    return codegen


@intrinsic
def prefetch(typingctx, arr, index):
    """``prefetch(a, i)``: the cache line of ``a[i]`` requested for reading (see the module)."""
    if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
        return None
    return types.void(arr, index), _prefetch_codegen(LOCALITY)


@intrinsic
def prefetch_l1(typingctx, arr, index):
    """``prefetch(a, i)`` into L1 (``prefetcht0``): for a stream already in L2 that a kernel
    reads faster than the hardware prefetcher brings it up. A single row's product over the
    panels, 800 KB of them: 72 -> 92 GB/s in a scratch stream reading 1024 floats ahead."""
    if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
        return None
    return types.void(arr, index), _prefetch_codegen(3)
