"""Vector loads: a serial reduction stepped LANES at a time, its contiguous operands read as one vector.

A reduction whose body reads float32 buffers at consecutive addresses along the reduction
(a dot product's row of weights and its vector, a softmax's row) can read those operands LANES
elements per load (OpenCL's vload4, CUDA's float4: the dialect's `load4`) and then compute the
LANES steps one after the other from the vector's lanes, in the serial loop's order, so the
result is the plain form's bit for bit. The guard (`vector_loads`) is the renderer's as well as
the search space's: a reduction of constant extent, a multiple of LANES; each vectorized load
contiguous (index stride 1 along the reduction), unmasked and 16-byte aligned (the index at the
reduction's start a multiple of LANES for every value of the other indices: its constant and
every coefficient multiples of LANES; buffer offsets are: inputs start at 0, arena offsets are
64-byte aligned, compiler/memory.py); everything else that varies along the reduction computed
per lane (no nested reduction or gather does). A kernel that fails the guard renders its plain
loop, so a schedule found for one kernel stays right for another of the same structure.
"""
from __future__ import annotations

from ...compiler.kernels import Gather, Kernel, KernelProgram, Load, Reduce, children, depends_on, split_reductions, walk
from ...symbolic import Sum, sym

LANES = 4
LANE_NAMES = "xyzw"  # a float4's components, spelled alike in OpenCL C and CUDA C


def _multiple_of(e, n: int) -> bool:
    """Whether the integer expression `e` is a multiple of n for every value of its variables."""
    if e.is_const:
        return e.value % n == 0
    return isinstance(e, Sum) and e.const % n == 0 and all(c % n == 0 for _, c in e.terms)


def contiguous(load: Load, red: Reduce) -> bool:
    """Whether `load` reads LANES aligned consecutive elements for LANES consecutive reduction steps."""
    r = red.var.name
    step = load.index.substitute({r: red.var + 1}) - load.index
    return step.is_const and step.value == 1 and _multiple_of(load.index.substitute({r: 0}), LANES)


def vector_loads(program: KernelProgram | None, red: Reduce) -> list[Load] | None:
    """The loads of `red`'s body read LANES at a time when its loop runs in steps of LANES, or
    None when the reduction cannot run so (see the module doc) or nothing would be vectorized.
    Without a program (the search space's view of a kernel) the buffers' dtypes are not known:
    the renderer, which has them, refuses what is not float32."""
    if not (red.extent.is_const and red.extent.value >= LANES and red.extent.value % LANES == 0):
        return None
    r, found = red.var.name, []

    def lane_computable(e) -> bool:
        if r not in depends_on(e):
            return True
        if isinstance(e, (Reduce, Gather)):
            return False
        if isinstance(e, Load) and e.valid == sym(1) and (program is None or program.buffers[e.buffer].dtype == "float32") \
                and contiguous(e, red) and e not in found:
            found.append(e)
        return all(lane_computable(c) for c in children(e))
    return found if lane_computable(red.body) and found else None


def vectorizable(kernel: Kernel) -> bool:
    """Whether some reduction of the kernel, as the loop forms render it, could use vector loads."""
    return any(isinstance(n, Reduce) and vector_loads(None, n) for n in walk(split_reductions(kernel.value)))
