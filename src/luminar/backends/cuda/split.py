"""A reduction split across blocks: few outputs, each the reduction of many values (a loss, a sum).

The opencl forms give each output element one work-item (Grid) or one work-group (Rows), so a
sum of 64M values to one scalar would run on one thread. Here each output gets `blocks` blocks of
`local` threads: every thread reduces a strided share of the reduction (consecutive threads read
consecutive elements), each block combines its threads' values in shared memory and stores its
partial, and the last block to finish (an atomic counter per output) combines the partials and
writes the output through the kernel's epilogue. The order of every combination is fixed by
the grid, so results are deterministic (not bitwise the serial order's: within float32 rounding).

The partials and counters are static variables of the kernel function (global memory, one set
per module, zero at load); the last block resets its counter, so every launch, and every replay
of a CUDA graph, starts from zero. Launches of one function never overlap: a program's calls
run in order on one stream.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...compiler.analysis import single_reduce
from ...compiler.kernels import Kernel, numel
from ...ops import PRIMITIVES
from ..opencl.dialect import Dialect
from ..opencl.render import Emitter, _unflatten, render_float
# (the opencl target's split form decides where splitting applies, and combines a block's values, alike)
from ..opencl.split import MAX_OUTPUTS, LastGroup, applies, last_group_combines  # noqa: F401  (applies: cuda/target.py's)

# the partial visible device-wide before the count; the last block fences again, then reads the
# partials through a volatile pointer (not from its cache)
CUDA_LAST_BLOCK = LastGroup("__threadfence();", "atomicAdd(&{0}, 1u)", "__threadfence();",
                            "((volatile float *)lm_partials)[{0}]")


@dataclass(frozen=True)
class Split:
    kind: ClassVar[str] = "split"
    blocks: int = 512  # blocks per output (about four per SM of an H200)
    local: int = 256  # threads per block: a power of two (the shared-memory reduction halves it)

    def describe(self) -> str:
        return (f"split: each output's reduction over {self.blocks} blocks of {self.local}, "
                "the partials combined in order by the last block")

    def render(self, program, kernel: Kernel, dialect: Dialect) -> list[str]:
        if not applies(kernel) or self.local & (self.local - 1):
            raise ValueError(f"{kernel.name}: the split form needs one reduction, at most {MAX_OUTPUTS} outputs "
                             "and a power-of-two block")
        return render_split(program, kernel, self, dialect)

    def launch(self, kernel: Kernel, env: dict) -> tuple[tuple, tuple] | None:
        outputs = numel(kernel.shape).value
        return ((self.blocks, outputs, 1), (self.local, 1, 1)) if outputs else None


def render_split(program, kernel: Kernel, s: Split, d: Dialect) -> list[str]:
    red = single_reduce(kernel)
    prim, ix, outputs = PRIMITIVES[red.op], d.index, numel(kernel.shape).value
    r, identity = red.var.name, render_float(prim.identity)
    lines = [f"    static float lm_partials[{outputs * s.blocks}];", f"    static unsigned lm_done[{outputs}];",
             f"    {d.local_array} float lm_part[{s.local}];", f"    {d.local_array} int lm_last;",
             f"    const {ix} lm_flat = ({ix}){d.group_id.format(1)}, lm_block = ({ix}){d.group_id.format(0)};",
             f"    const int lm_lid = (int){d.local_id.format(0)};"]
    lines += _unflatten("lm_flat", kernel.loop_vars, kernel.shape, d) if kernel.shape else []
    em = Emitter(program, d, "    ")
    em.hoist(red.body, r)
    em.lines += [f"    float lm_acc = {identity};", "    #pragma unroll 4",
                 f"    for ({ix} {r} = lm_block * {s.local} + lm_lid; {r} < {red.extent.render_c()}; "
                 f"{r} += {s.blocks * s.local}) {{"]
    value = em.block(red.body)
    em.lines += [f"        lm_acc = {prim.c.format('lm_acc', value)};", "    }"]
    em.lines += last_group_combines(kernel, em, s.blocks, s.local, d, CUDA_LAST_BLOCK)
    return lines + em.lines
