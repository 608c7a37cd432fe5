"""Tensor-core tiles: matmul-shaped kernels on mma.sync (TF32 or BF16 inputs, float32 sums).

A kernel qualifies when its reduction is a sum of (row operand) x (panel operand), one of each
(analysis.plan_tiles: x @ w, also with a dequantized weight or a scaled input). A thread block
of wm x wn warps computes a (wm*tm*16) x (wn*tn*8) block of outputs; each warp a tm x tn grid of
16x8 accumulator tiles. Every `kt` reduction steps the block stages both operands in shared
memory as floats (computed there from the IR, so dequantization happens once per staged
element; steps past the reduction's end stage zeros), then each warp feeds its fragments to

- `tf32`: mma.sync m16n8k8 with operands rounded to TF32 (cvt.rna): ~10 bits of mantissa, so
  only when the user allows it (compile(..., allow_tf32=True), PyTorch's convention);
- `bf16`: mma.sync m16n8k16 with operands as bfloat16: exact when both operands are bfloat16
  values already (loads of bfloat16 storage), which is the only case it is offered for.

Sums stay float32 (in a different order than the serial reference: within float32 rounding).
The epilogue (what the kernel does with the sum: a bias, an activation) runs per output as in
the other forms. Fragment layouts are PTX ISA's for .row.col mma (sec. 9.7.13.4.7/.8): lane =
4 * group + thread-in-group; A element (group [+8], thread [+4]) for tf32, (group [+8],
2*thread [+1] [+8]) for bf16; B (k, n = group); C (group [+8], 2*thread [+1]).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...compiler.analysis import TilePlan, plan_tiles, stride
from ...compiler.kernels import Apply, Kernel, Load, flat_index, loads, numel
from ..opencl.dialect import Dialect
from ..opencl.render import Emitter, _unflatten

STEP = {"tf32": 8, "bf16": 16}  # reduction steps of one mma instruction
A_PAD, B_PAD = 4, 8  # shared-memory row padding: fragment reads of a warp hit 32 distinct banks
STATIC_SHARED = 48 * 1024  # bytes of shared memory a kernel may declare statically


class TensorTiles:
    """What the tensor-core forms (Mma here, wgmma.Wgmma) share: a block of outputs per thread
    block of `threads` (one dimension), both operands staged every `kt` steps of the reduction,
    a `precision` the instruction takes; each form says its block, threads, shared memory and
    body (`_render`), how its threads are arranged (`_layout`), and what else it needs to be legal
    (`_fits`)."""
    kind: ClassVar[str]

    def legal(self) -> bool:
        return (self.precision in STEP and self.kt % STEP[self.precision] == 0 and self.threads <= 1024
                and self.shared_bytes() <= STATIC_SHARED and self._fits())

    def _fits(self) -> bool:
        return True

    def describe(self) -> str:
        bi, bj = self.block
        return (f"{self.kind} {self.precision}{self._layout()} ({bi}x{bj} outputs per block), "
                f"{self.kt} steps staged in shared memory")

    def render(self, program, kernel: Kernel, dialect: Dialect) -> list[str]:
        """The kernel's body in this form (render.render_kernel calls it for forms it does not know)."""
        plan = plan_tiles(kernel)
        if operands(kernel, plan) is None or not self.legal():
            raise ValueError(f"{kernel.name}: the {self.kind} form needs a sum of row x panel products ({self.describe()})")
        return self._render(program, kernel, plan, dialect)

    def launch(self, kernel: Kernel, env: dict) -> tuple[tuple, tuple] | None:
        """(grid, block) of a call, in blocks and threads (cuLaunchKernel's units); None: nothing to do."""
        value = lambda e: e.value if e.is_const else int(e.evaluate(env))  # noqa: E731
        rows, cols, batch = value(kernel.shape[-2]), value(kernel.shape[-1]), value(numel(kernel.shape[:-2]))
        if not rows * cols * batch:
            return None
        bi, bj = self.block
        return (-(-cols // bj), -(-rows // bi), batch), (self.threads, 1, 1)


@dataclass(frozen=True)
class Mma(TensorTiles):
    kind: ClassVar[str] = "mma"
    wm: int = 2  # warps along the rows
    wn: int = 2  # warps along the columns
    tm: int = 2  # 16-row accumulator tiles per warp
    tn: int = 4  # 8-column accumulator tiles per warp
    kt: int = 32  # reduction steps staged in shared memory at a time (a multiple of the mma's)
    precision: str = "tf32"  # "tf32" or "bf16": what the operands are rounded to

    @property
    def block(self) -> tuple[int, int]:
        return self.wm * self.tm * 16, self.wn * self.tn * 8

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    def shared_bytes(self) -> int:
        bi, bj = self.block
        return 4 * (bi * (self.kt + A_PAD) + self.kt * (bj + B_PAD))

    def _layout(self) -> str:
        return f": {self.wm}x{self.wn} warps of {self.tm}x{self.tn} tensor-core tiles"

    def _render(self, program, kernel: Kernel, plan: TilePlan, dialect: Dialect) -> list[str]:
        return render_mma(program, kernel, plan, self, dialect)


def operands(kernel: Kernel, plan: TilePlan | None):
    """(row operand, panel operand) when the kernel's reduction is a sum of their products, else None."""
    if plan is None or plan.i is None or plan.reduce.op != "sum_reduce" or len(plan.rows) != 1 or len(plan.panels) != 1:
        return None
    body = plan.reduce.body
    if not isinstance(body, Apply) or body.op != "mul" or set(body.args) != {plan.rows[0], plan.panels[0]}:
        return None
    return plan.rows[0], plan.panels[0]


def precisions(program, kernel: Kernel, allow_tf32: bool) -> list[str]:
    """The tensor-core precisions that keep this kernel's results what the user asked for: bf16
    when both operands are bfloat16 values (exact), tf32 when the user allowed it."""
    found = operands(kernel, plan_tiles(kernel))
    if found is None:
        return []
    exact = all(isinstance(x, Load) and program.buffers[x.buffer].dtype == "bfloat16" for x in found)
    return (["bf16"] if exact else []) + (["tf32"] if allow_tf32 else [])


def _along_reduction(node, var) -> bool:
    """Whether the operand's reads are contiguous along the reduction (then staging walks it fastest)."""
    return any(stride(ld.index, var) == 1 for ld in loads(node))


def _unrolled(s: Mma, indent: str) -> list[str]:
    """Loops over every accumulator (tile m, n; element q), unrolled: indexed by constants only,
    the accumulators stay in registers (a loop ptxas kept would put them in local memory)."""
    return [f"{indent}#pragma unroll", f"{indent}for (int lm_m = 0; lm_m < {s.tm}; lm_m++)",
            f"{indent}#pragma unroll", f"{indent}for (int lm_n = 0; lm_n < {s.tn}; lm_n++)",
            f"{indent}#pragma unroll", f"{indent}for (int lm_q = 0; lm_q < 4; lm_q++)"]


def stage(program, d: Dialect, plan: TilePlan, node, var, extent: str, corner: str, block: int, kt: int, threads: int,
          store: str, count: list, convert: str = "{0}") -> list[str]:
    """Code storing the `block` x `kt` values of an operand (`var`, the row or column variable, from
    `corner` up to `extent`) for the reduction steps from lm_k0: `store` is the element (lm_e,
    lm_k)'s place, `convert` what is stored of the value (zero past the reduction's end). The
    threads walk the reduction fastest when the operand is contiguous along it."""
    ix, r, K = d.index, plan.reduce.var.name, plan.reduce.extent.render_c()
    em = Emitter(program, d, "            ")
    em.count = count
    value = em.emit(node)
    e, k = (f"lm_s / {kt}", f"lm_s % {kt}") if _along_reduction(node, plan.reduce.var) else (f"lm_s % {block}", f"lm_s / {block}")
    return [f"        for (int lm_s = lm_tid; lm_s < {block * kt}; lm_s += {threads}) {{",
            f"            const int lm_e = {e}, lm_k = {k};",
            f"            const {ix} {var.name} = min({corner} + lm_e, ({ix})({extent}) - 1);",
            f"            const {ix} {r} = min(lm_k0 + lm_k, ({ix})({K}) - 1);"] + em.lines + \
        [f"            {store} = {convert.format(f'(lm_k0 + lm_k < ({ix})({K}) ? {value} : 0.0f)')};", "        }"]


def extents(kernel: Kernel, plan: TilePlan) -> tuple[str, str, str]:
    """The output's rows and columns and the reduction's length, as C expressions."""
    return kernel.shape[-2].render_c(), kernel.shape[-1].render_c(), plan.reduce.extent.render_c()


def render_mma(program, kernel: Kernel, plan: TilePlan, s: Mma, d: Dialect) -> list[str]:
    red, i, j = plan.reduce, plan.i, plan.j
    row, panel = operands(kernel, plan)
    ix, kt, step = d.index, s.kt, STEP[s.precision]
    bi, bj = s.block
    M, N, K = extents(kernel, plan)
    sa, sb = kt + A_PAD, bj + B_PAD  # row strides of the staged operands (lm_a[bi][sa], lm_b[kt][sb])
    lines = [f"    {d.local_array} float lm_a[{bi * sa}];", f"    {d.local_array} float lm_b[{kt * sb}];",
             f"    const int lm_tid = (int){d.local_id.format(0)}, lm_warp = lm_tid / 32, lm_lane = lm_tid % 32;",
             "    const int lm_g = lm_lane / 4, lm_t = lm_lane % 4;",
             f"    const int lm_wr = (lm_warp / {s.wn}) * {s.tm * 16}, lm_wc = (lm_warp % {s.wn}) * {s.tn * 8};",
             f"    const {ix} lm_j0 = ({ix}){d.group_id.format(0)} * {bj}, lm_i0 = ({ix}){d.group_id.format(1)} * {bi};",
             f"    const {ix} lm_batch = ({ix}){d.group_id.format(2)};",
             f"    if (lm_batch >= {numel(kernel.shape[:-2]).render_c()}) return;  // (a launch for dims rounded up)"]
    lines += _unflatten("lm_batch", kernel.loop_vars[:-2], kernel.shape[:-2], d)
    lines += [f"    float lm_acc[{s.tm}][{s.tn}][4];", *_unrolled(s, "    "), "        lm_acc[lm_m][lm_n][lm_q] = 0.0f;",
              f"    for ({ix} lm_k0 = 0; lm_k0 < {K}; lm_k0 += {kt}) {{"]
    count = [0]
    lines += stage(program, d, plan, row, i, M, "lm_i0", bi, kt, s.threads, f"lm_a[lm_e * {sa} + lm_k]", count)
    lines += stage(program, d, plan, panel, j, N, "lm_j0", bj, kt, s.threads, f"lm_b[lm_k * {sb} + lm_e]", count)
    lines += [f"        {d.barrier}", "        #pragma unroll", f"        for (int lm_kk = 0; lm_kk < {kt}; lm_kk += {step}) {{"]
    A = lambda m, dr, dk: f"lm_a[(lm_wr + {m} * 16 + lm_g + {dr}) * {sa} + lm_kk + {dk}]"  # noqa: E731
    B = lambda n, dk: f"lm_b[(lm_kk + {dk}) * {sb} + lm_wc + {n} * 8 + lm_g]"  # noqa: E731
    lines += [f"            unsigned lm_fa[{s.tm}][4], lm_fb[{s.tn}][2];", "            #pragma unroll",
              f"            for (int lm_m = 0; lm_m < {s.tm}; lm_m++) {{"]
    if s.precision == "tf32":
        lines += [f"                lm_fa[lm_m][0] = lm_tf32({A('lm_m', 0, 'lm_t')});",
                  f"                lm_fa[lm_m][1] = lm_tf32({A('lm_m', 8, 'lm_t')});",
                  f"                lm_fa[lm_m][2] = lm_tf32({A('lm_m', 0, 'lm_t + 4')});",
                  f"                lm_fa[lm_m][3] = lm_tf32({A('lm_m', 8, 'lm_t + 4')});", "            }",
                  "            #pragma unroll", f"            for (int lm_n = 0; lm_n < {s.tn}; lm_n++) {{",
                  f"                lm_fb[lm_n][0] = lm_tf32({B('lm_n', 'lm_t')});",
                  f"                lm_fb[lm_n][1] = lm_tf32({B('lm_n', 'lm_t + 4')});", "            }"]
    else:
        pair_a = lambda dr, dk: f"lm_bf16x2({A('lm_m', dr, dk)}, {A('lm_m', dr, dk + ' + 1')})"  # noqa: E731
        pair_b = lambda dk: f"lm_bf16x2({B('lm_n', dk)}, {B('lm_n', dk + ' + 1')})"  # noqa: E731
        lines += [f"                lm_fa[lm_m][0] = {pair_a(0, '2 * lm_t')};",
                  f"                lm_fa[lm_m][1] = {pair_a(8, '2 * lm_t')};",
                  f"                lm_fa[lm_m][2] = {pair_a(0, '2 * lm_t + 8')};",
                  f"                lm_fa[lm_m][3] = {pair_a(8, '2 * lm_t + 8')};", "            }",
                  "            #pragma unroll", f"            for (int lm_n = 0; lm_n < {s.tn}; lm_n++) {{",
                  f"                lm_fb[lm_n][0] = {pair_b('2 * lm_t')};",
                  f"                lm_fb[lm_n][1] = {pair_b('2 * lm_t + 8')};", "            }"]
    lines += ["            #pragma unroll", f"            for (int lm_m = 0; lm_m < {s.tm}; lm_m++)",
              "            #pragma unroll", f"            for (int lm_n = 0; lm_n < {s.tn}; lm_n++)",
              f"                lm_mma_{s.precision}(lm_acc[lm_m][lm_n], lm_fa[lm_m][0], lm_fa[lm_m][1], lm_fa[lm_m][2], "
              "lm_fa[lm_m][3], lm_fb[lm_n][0], lm_fb[lm_n][1]);",
              "        }", f"        {d.barrier}", "    }"]
    # the epilogue per output: accumulator q of tile (m, n) is at (group [+8 for q >= 2], 2 * thread [+1 for odd q])
    out = Emitter(program, d, "            ", {red: "lm_acc[lm_m][lm_n][lm_q]"})
    out.count = count
    value = out.emit(kernel.value)
    where = flat_index(kernel.loop_vars, kernel.shape).render_c()
    lines += [*_unrolled(s, "    ")[:-1], "    for (int lm_q = 0; lm_q < 4; lm_q++) {",
              f"        const {ix} {i.name} = lm_i0 + lm_wr + lm_m * 16 + lm_g + (lm_q >> 1) * 8, "
              f"{j.name} = lm_j0 + lm_wc + lm_n * 8 + 2 * lm_t + (lm_q & 1);",
              f"        if ({i.name} < {M} && {j.name} < {N}) {{"] + out.lines + \
        [f"            b{kernel.out}[{where}] = {value};", "        }", "    }"]
    return lines


def from_tile(wi: int, wj: int, ri: int, rj: int, kt: int, precision: str) -> Mma | None:
    """The tensor-core form with the block of a Tiled form (wi x wj threads, ri x rj outputs each),
    or None when no arrangement of whole warps over 16x8 tiles covers that block."""
    bi, bj, threads = wi * ri, wj * rj, wi * wj
    if threads % 32 or bi % 16 or bj % 8:
        return None
    warps, tiles_i, tiles_j = threads // 32, bi // 16, bj // 8
    for wm in range(min(warps, tiles_i), 0, -1):
        if warps % wm == 0 and tiles_i % wm == 0 and tiles_j % (warps // wm) == 0:
            mma = Mma(wm, warps // wm, tiles_i // wm, tiles_j // (warps // wm), kt, precision)
            return mma if mma.legal() and mma.tm * mma.tn <= 16 else None
    return None

