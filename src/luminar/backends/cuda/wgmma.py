"""Hopper's warpgroup tensor-core tiles: matmul-shaped kernels on wgmma.mma_async (sm_90a only).

The same kernels as the mma form (mma.py: a sum of row x panel products; TF32 only when the
user allows it, BF16 only on bfloat16 values), on the instruction Hopper adds: a warpgroup (4
warps, 128 threads) computes a 64 x n tile in one instruction per k-step (8 for TF32, 16 for
BF16), its B operand read by the tensor cores from shared memory through a descriptor, its A
operand from registers (fragments as mma.sync's m16n8k8 / m16n8k16, one 16-row slice per warp).
A block of `groups` warpgroups covers (64 * groups) x n outputs; each stages, every `kt`
reduction steps, the row operand as floats (lm_a, as the mma form) and the panel operand in
the tensor cores' no-swizzle K-major layout: core matrices of 8 columns x 16 bytes (4 TF32
values, rounded as the mma form rounds them, or 8 bfloat16), the two of one k-step 128 bytes
apart (the descriptor's leading-dimension offset), the 8-column groups 8 * kt elements apart
(its stride-dimension offset). Each wgmma is fenced, committed and waited for before the next
(the A fragments are then free to change): simple rather than fast.

Only a cubin for sm_90a runs it (an H100/H200's architecture with its Hopper-only features);
the cuda target compiles a program with a wgmma kernel for sm_90a and every other for sm_90.
The instructions are written against the PTX ISA's description (9.7.15: the register fragments
of A and D, the matrix descriptor); no GPU has run them yet: the GPU check validates this form
against the plain one like any candidate, and the search never times a form that fails that.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...compiler.analysis import TilePlan
from ...compiler.kernels import Kernel, flat_index, numel
from ..opencl.dialect import Dialect
from ..opencl.render import Emitter, _unflatten
from .mma import A_PAD, STEP, TensorTiles, extents, operands, stage

WIDTHS = (32, 64, 128)  # the columns per block offered (the instruction takes 8 to 256)
ELEMENT_BYTES = {"tf32": 4, "bf16": 2}  # of the panel operand in shared memory
SM90A = ("sm_90", "sm_90a")  # the architectures whose devices run sm_90a cubins


@dataclass(frozen=True)
class Wgmma(TensorTiles):
    kind: ClassVar[str] = "wgmma"
    groups: int = 1  # warpgroups along the rows (64 rows each)
    n: int = 64  # columns per block
    kt: int = 32  # reduction steps staged in shared memory at a time (a multiple of the instruction's)
    precision: str = "tf32"

    @property
    def block(self) -> tuple[int, int]:
        return 64 * self.groups, self.n

    @property
    def threads(self) -> int:
        return 128 * self.groups

    def shared_bytes(self) -> int:
        return 4 * 64 * self.groups * (self.kt + A_PAD) + ELEMENT_BYTES.get(self.precision, 4) * self.n * self.kt

    def _fits(self) -> bool:
        return self.n in WIDTHS

    def _layout(self) -> str:
        return f" (sm_90a): {self.groups} warpgroup(s) of 64x{self.n} tiles"

    def _render(self, program, kernel: Kernel, plan: TilePlan, dialect: Dialect) -> list[str]:
        return render_wgmma(program, kernel, plan, self, dialect)


def from_tile(wi: int, wj: int, ri: int, rj: int, kt: int, precision: str) -> Wgmma | None:
    """The wgmma form with the block of a Tiled form, or None when its threads are not one
    warpgroup per 64 rows or its columns not a width offered."""
    bi, bj = wi * ri, wj * rj
    if bi % 64 or wi * wj != 128 * (bi // 64) or bj not in WIDTHS:
        return None
    form = Wgmma(bi // 64, bj, kt, precision)
    return form if form.legal() else None


def _instruction(precision: str, n: int) -> str:
    """The helper issuing one wgmma (A from registers, B by descriptor, D += A B) on this thread's
    n / 2 accumulators, fenced before and waited for after."""
    regs = n // 2
    shape = f"m64n{n}k{STEP[precision]}"
    kind = "f32.tf32.tf32" if precision == "tf32" else "f32.bf16.bf16"
    d = ",".join(f"%{k}" for k in range(regs))
    a = ",".join(f"%{regs + k}" for k in range(4))
    # the predicate scale-d true (D accumulates), imm-scale-a/b 1; bf16 takes imm-trans-b (0: B is K-major)
    tail = "p, 1, 1" if precision == "tf32" else "p, 1, 1, 0"
    outputs = ", ".join(f'"+f"(c[{k}])' for k in range(regs))
    return (f"static __device__ __forceinline__ void lm_wgmma_{precision}_n{n}(float *c, unsigned a0, unsigned a1, "
            f"unsigned a2, unsigned a3, const void *base, unsigned long long desc) {{\n"
            f'    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");\n'
            f'    asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{regs + 5}, 0; "\n'
            f'                 "wgmma.mma_async.sync.aligned.{shape}.{kind} {{{d}}}, {{{a}}}, %{regs + 4}, {tail}; }}"\n'
            f'                 : {outputs} : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));\n'
            f'    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");\n'
            f'    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");\n}}\n')


# the CUDA prelude's part for sm_90a (preprocessed away for every other architecture)
PRELUDE = "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n" + """\
/* a shared-memory matrix descriptor (no swizzle): start address, leading and stride byte offsets, in 16-byte units */
static __device__ __forceinline__ unsigned long long lm_wgmma_desc(const void *smem, unsigned offset, unsigned lbo, unsigned sbo) {
    const unsigned address = (unsigned)__cvta_generic_to_shared(smem) + offset;
    return (unsigned long long)((address & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16)
         | ((unsigned long long)(sbo >> 4) << 32);
}
static __device__ __forceinline__ void lm_fence_async_shared(void) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
""" + "".join(_instruction(p, n) for p in STEP for n in WIDTHS) + "#endif\n"


def render_wgmma(program, kernel: Kernel, plan: TilePlan, s: Wgmma, d: Dialect) -> list[str]:
    (row, panel), (bi, bj), (M, N, K) = operands(kernel, plan), s.block, extents(kernel, plan)
    i, j, ix, kt = plan.i, plan.j, d.index, s.kt
    per = 16 // ELEMENT_BYTES[s.precision]  # panel elements per 16-byte core-matrix row
    sa, regs = kt + A_PAD, s.n // 2
    element = "float" if s.precision == "tf32" else "unsigned short"
    # the panel's element (column e, step k) in the K-major no-swizzle layout (see the module doc)
    where_b = f"(lm_e / 8) * {8 * kt} + (lm_k / {per}) * {8 * per} + (lm_e % 8) * {per} + lm_k % {per}"
    convert = "__uint_as_float(lm_tf32({0}))" if s.precision == "tf32" else "(unsigned short)(__float_as_uint({0}) >> 16)"
    lines = [f"    {d.local_array} float lm_a[{bi * sa}];",
             f"    {d.local_array} __align__(128) {element} lm_b[{bj * kt}];",
             f"    const int lm_tid = (int){d.local_id.format(0)}, lm_warp = lm_tid / 32, lm_lane = lm_tid % 32;",
             "    const int lm_g = lm_lane / 4, lm_t = lm_lane % 4;",
             "    const int lm_wr = lm_warp * 16;  /* this warp's 16 rows: warpgroup lm_warp / 4, slice lm_warp % 4 */",
             f"    const {ix} lm_j0 = ({ix}){d.group_id.format(0)} * {bj}, lm_i0 = ({ix}){d.group_id.format(1)} * {bi};",
             f"    const {ix} lm_batch = ({ix}){d.group_id.format(2)};",
             f"    if (lm_batch >= {numel(kernel.shape[:-2]).render_c()}) return;  // (a launch for dims rounded up)"]
    lines += _unflatten("lm_batch", kernel.loop_vars[:-2], kernel.shape[:-2], d)
    lines += [f"    float lm_acc[{regs}];", "    #pragma unroll", f"    for (int lm_q = 0; lm_q < {regs}; lm_q++) lm_acc[lm_q] = 0.0f;",
              f"    for ({ix} lm_k0 = 0; lm_k0 < {K}; lm_k0 += {kt}) {{"]
    count = [0]
    lines += stage(program, d, plan, row, i, M, "lm_i0", bi, kt, s.threads, f"lm_a[lm_e * {sa} + lm_k]", count)
    lines += stage(program, d, plan, panel, j, N, "lm_j0", bj, kt, s.threads, f"lm_b[{where_b}]", count, convert)
    A = lambda dr, dk: f"lm_a[(lm_wr + lm_g + {dr}) * {sa} + lm_kk + {dk}]"  # noqa: E731
    if s.precision == "tf32":
        fragments = [f"lm_tf32({A(0, 'lm_t')})", f"lm_tf32({A(8, 'lm_t')})",
                     f"lm_tf32({A(0, 'lm_t + 4')})", f"lm_tf32({A(8, 'lm_t + 4')})"]
    else:
        fragments = [f"lm_bf16x2({A(dr, f'2 * lm_t + {dk}')}, {A(dr, f'2 * lm_t + {dk + 1}')})" for dk in (0, 8) for dr in (0, 8)]
    lines += ["        lm_fence_async_shared();  /* the staged panel, written by threads, is read by the tensor cores */",
              f"        {d.barrier}", "        #pragma unroll", f"        for (int lm_kk = 0; lm_kk < {kt}; lm_kk += {STEP[s.precision]}) {{",
              f"            const unsigned long long lm_desc = lm_wgmma_desc(lm_b, (lm_kk / {per}) * {16 * 8}, 128, "
              f"{8 * kt * ELEMENT_BYTES[s.precision]});",
              f"            lm_wgmma_{s.precision}_n{s.n}(lm_acc, {', '.join(fragments)}, lm_b, lm_desc);", "        }",
              f"        {d.barrier}", "    }"]
    # the epilogue per output: accumulator 4 * c + q is at row group [+8 for q >= 2], column 8 * c + 2 * thread [+1 for odd q]
    out = Emitter(program, d, "            ", {plan.reduce: "lm_acc[lm_q]"})
    out.count = count
    value = out.emit(kernel.value)
    where = flat_index(kernel.loop_vars, kernel.shape).render_c()
    lines += ["    #pragma unroll", f"    for (int lm_q = 0; lm_q < {regs}; lm_q++) {{",
              f"        const {ix} {i.name} = lm_i0 + lm_wr + lm_g + ((lm_q >> 1) & 1) * 8, "
              f"{j.name} = lm_j0 + (lm_q >> 2) * 8 + 2 * lm_t + (lm_q & 1);",
              f"        if ({i.name} < {M} && {j.name} < {N}) {{"] + out.lines + \
        [f"            b{kernel.out}[{where}] = {value};", "        }", "    }"]
    return lines
