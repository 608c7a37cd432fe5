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
from ..opencl.split import MAX_OUTPUTS, applies, combine as _combine  # noqa: F401  (applies: cuda/target.py's)


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
    em.lines += [f"        lm_acc = {prim.c.format('lm_acc', value)};", "    }", "    lm_part[lm_lid] = lm_acc;"]
    em.lines += _combine(prim, s.local, d) + [
        "    if (lm_lid == 0) {",
        f"        lm_partials[lm_flat * {s.blocks} + lm_block] = lm_part[0];",
        "        __threadfence();  // the partial is visible before the counter says so",
        f"        lm_last = atomicAdd(&lm_done[lm_flat], 1u) == {s.blocks - 1};", "    }", f"    {d.barrier}",
        "    if (!lm_last) return;  // (uniform across the block: lm_last is shared)",
        "    __threadfence();",
        f"    float lm_total = {identity};",
        f"    for (int lm_b = lm_lid; lm_b < {s.blocks}; lm_b += {s.local}) "
        f"lm_total = {prim.c.format('lm_total', f'((volatile float *)lm_partials)[lm_flat * {s.blocks} + lm_b]')};",
        "    lm_part[lm_lid] = lm_total;"] + _combine(prim, s.local, d) + ["    if (lm_lid == 0) {"]
    out = Emitter(program, d, "        ", {**em.names, red: "lm_part[0]"})
    out.count = em.count
    result = out.emit(kernel.value)
    em.lines += out.lines + [f"        b{kernel.out}[lm_flat] = {result};", "        lm_done[lm_flat] = 0;", "    }"]
    return lines + em.lines
