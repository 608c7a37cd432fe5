"""The CPU backend: the whole graph as one C translation unit, compiled once, called once.

Each kernel becomes a C function with a loop nest over its output (outer loops split across
threads with OpenMP, inner loops left to the compiler's vectorizer) and an accumulator loop
per reduction; one entry point `lm_run(buffers, dims)` runs them in order. Symbolic dims are
arguments, so a new sequence length needs no recompile. Temporaries live in one arena planned
by liveness (compiler/memory.py). Shared objects are cached on disk by source hash.
"""
from __future__ import annotations

import ctypes
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..compiler.kernels import (Apply, Const, Gather, IndexValue, Kernel, KernelProgram, Load, Reduce, Select,
                                depends_on, flat_index, loads, lower, numel, walk)
from ..compiler.memory import ALIGN, MemoryPlan, lifetimes, plan_memory
from ..errors import UnsupportedError
from ..ops import PRIMITIVES
from ..program import Program
from ..symbolic import C_HELPERS, Expr, Var, sym
from . import cc

C_TYPES = {"float32": "float", "float16": "_Float16", "bfloat16": "unsigned short", "int8": "signed char",
           "uint8": "unsigned char", "int32": "int"}
PARALLEL_MIN_WORK = 1 << 18  # below this many inner iterations (~50 µs) threads cost more than they save

PRELUDE = f"""\
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>
{C_HELPERS}
/* vector variants from glibc's libmvec (what <math.h> declares only under -ffast-math) */
extern float exp2f(float) __attribute__((simd("notinbranch")));
extern float log2f(float) __attribute__((simd("notinbranch")));
extern float sinf(float) __attribute__((simd("notinbranch")));
static inline float lm_bf16(unsigned short b) {{ union {{ uint32_t u; float f; }} v = {{ (uint32_t)b << 16 }}; return v.f; }}
"""


def render_float(v: float) -> str:
    if v != v:
        return "NAN"
    if v in (float("inf"), float("-inf")):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"{float(np.float32(v))!r}f"


class _Emitter:
    """Turns an IR expression into C statements, naming each distinct subexpression once."""

    def __init__(self, program: KernelProgram, indent: str, threaded_reduce: bool = False):
        self.program, self.indent = program, indent
        self.threaded_reduce = threaded_reduce  # split the first reduction across threads (scalar outputs)
        self.lines: list[str] = []
        self.names: dict = {}
        self.count = 0

    def fresh(self, prefix="v") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def emit(self, e) -> str:
        if e in self.names:
            return self.names[e]
        if isinstance(e, Const):
            return render_float(e.value)
        if isinstance(e, IndexValue):
            code = f"(float)({e.expr.render_c()})"
        elif isinstance(e, Load):
            code = self.load(e)
        elif isinstance(e, Apply):
            code = _power_of_two_mod(e, self) or PRIMITIVES[e.op].c.format(*(self.emit(a) for a in e.args))
        elif isinstance(e, Select):
            code = f"(({e.cond.render_c()}) ? {self.emit(e.value)} : 0.0f)"
        elif isinstance(e, Reduce):
            code = self.reduce(e)
        elif isinstance(e, Gather):
            code = self.gather(e)
        else:
            raise TypeError(f"unknown IR node {e!r}")
        name = self.fresh()
        self.lines.append(f"{self.indent}const float {name} = {code};")
        self.names[e] = name
        return name

    def load(self, e: Load) -> str:
        buf = self.program.buffers[e.buffer]
        read = f"b{buf.id}[{e.index.render_c()}]"
        read = f"lm_bf16({read})" if buf.dtype == "bfloat16" else f"(float){read}" if buf.dtype != "float32" else read
        return read if e.valid == sym(1) else f"(({e.valid.render_c()}) ? {read} : 0.0f)"

    def emit_block(self, e) -> str:
        """Emit `e` one level deeper (inside a loop or an if), reusing values already computed here."""
        inner = _Emitter(self.program, self.indent + "    ")
        inner.names, inner.count = dict(self.names), self.count
        value = inner.emit(e)
        self.lines += inner.lines
        self.count = inner.count
        return value

    def reduce(self, e: Reduce) -> str:
        prim = PRIMITIVES[e.op]
        acc = self.fresh("acc")
        self.lines.append(f"{self.indent}float {acc} = {render_float(prim.identity)};")
        if self.threaded_reduce:
            self.threaded_reduce = False
            op = "+" if e.op == "sum_reduce" else "max"
            self.lines.append(f"{self.indent}#pragma omp parallel for reduction({op}:{acc}) schedule(static) "
                              f"if(({(e.extent * _reduce_work(e.body)).render_c()}) >= {PARALLEL_MIN_WORK})")
        self.lines.append(f"{self.indent}for (long long {e.var.name} = 0; {e.var.name} < {e.extent.render_c()}; "
                          f"{e.var.name}++) {{")
        value = self.emit_block(e.body)
        self.lines.append(f"{self.indent}    {acc} = {prim.c.format(acc, value)};")
        self.lines.append(f"{self.indent}}}")
        return acc

    def gather(self, e: Gather) -> str:
        """The body evaluated once, at the integer the index holds (0.0 when it is not a valid index)."""
        out, index = self.fresh("gather"), self.emit(e.index)
        self.lines.append(f"{self.indent}float {out} = 0.0f;")
        self.lines.append(f"{self.indent}if ({index} >= 0.0f && {index} < (float)({e.extent.render_c()}) && "
                          f"{index} == (float)(long long){index}) {{")
        self.lines.append(f"{self.indent}    const long long {e.var.name} = (long long){index};")
        value = self.emit_block(e.body)
        self.lines.append(f"{self.indent}    {out} = {value};")
        self.lines.append(f"{self.indent}}}")
        return out


def _power_of_two_mod(e: Apply, emitter: _Emitter) -> str | None:
    """fmod by a power of two b >= 1 as a - trunc(a / b) * b: exact (dividing by 2^k cannot round
    or overflow, and the remainder is representable) and vectorizable, where fmodf is a library
    call per element. This is how quantized weights unpack their nibbles."""
    if e.op != "mod" or not isinstance(e.args[1], Const):
        return None
    b = abs(e.args[1].value)
    if not (1 <= b < float("inf") and np.frexp(b)[0] == 0.5):
        return None
    a = emitter.emit(e.args[0])
    return f"({a} - truncf({a} * {render_float(1.0 / b)}) * {render_float(b)})"


def render_kernel(program: KernelProgram, kernel: Kernel) -> str:
    """One C function computing `kernel` over its whole output."""
    used = sorted({load.buffer for load in loads(kernel.value)} | {kernel.out})
    lines = [f"static void {kernel.name}(void **restrict bufs, const long long *restrict dims) {{"]
    lines += [f"    const long long {d} = dims[{i}]; (void){d};" for i, d in enumerate(program.dims)]
    for b in used:
        ctype = C_TYPES[program.buffers[b].dtype]
        const = "" if b == kernel.out else "const "
        lines.append(f"    {const}{ctype} *restrict b{b} = ({const}{ctype} *)bufs[{b}];")
    tiles = plan_tiles(kernel)
    lines += render_tiled(program, kernel, tiles) if tiles else render_loops(program, kernel)
    return "\n".join(lines + ["}"])


def render_loops(program: KernelProgram, kernel: Kernel) -> list[str]:
    """The plain schedule: a loop per output dim (outer ones threaded), reductions innermost."""
    lines, loop_vars = [], kernel.loop_vars
    if kernel.shape:
        work = numel(kernel.shape) * _reduce_work(kernel.value)
        # keep the innermost loop whole for the vectorizer, unless a reduction is innermost anyway
        # (a matrix-vector product has a single output row: only its columns can be split)
        depth = len(kernel.shape) if work != numel(kernel.shape) else max(len(kernel.shape) - 1, 1)
        lines.append(f"    #pragma omp parallel for collapse({depth}) schedule(static) "
                     f"if(({work.render_c()}) >= {PARALLEL_MIN_WORK})")
    for var, extent in zip(loop_vars, kernel.shape):
        lines.append(f"    for (long long {var.name} = 0; {var.name} < {extent.render_c()}; {var.name}++)")
    lines.append("    {")
    emitter = _Emitter(program, "        ", threaded_reduce=not kernel.shape)
    value = emitter.emit(kernel.value)
    lines += emitter.lines
    lines.append(f"        b{kernel.out}[{flat_index(loop_vars, kernel.shape).render_c()}] = {value};")
    lines.append("    }")
    return lines


# -- the tiled reduction schedule ----------------------------------------------------------------
TILE_ROWS, TILE_COLS, ROW_CHUNK = 8, 32, 64


@dataclass
class TilePlan:
    """Register tiles of TI output rows x TJ output columns, the reduction loop outside the tile.

    Used when a reduction reads some operand with a non-unit stride along the reduced axis (the B
    of a matmul): reducing innermost would then stride through memory. Instead each step of the
    reduction updates a TI x TJ block of accumulators from TI row values (depend on the row, not
    the column) and TJ panel values (depend on the column, not the row), which are first copied
    into a contiguous panel buffer, so the inner loop is a unit-stride, vectorizable FMA.
    """
    reduce: Reduce
    i: Var | None  # the tile's row variable (second-innermost output dim), None for 1-d outputs
    j: Var  # the tile's column variable (innermost output dim)
    ti: int
    tj: int
    rows: list  # IR subtrees that depend on the row (and reduction), not the column
    panels: list  # IR subtrees that depend on the column (and reduction), not the row


def _stride(index: Expr, var: Var):
    """How far `index` moves when `var` grows by one, if that is a constant; else None."""
    step = index.substitute({var.name: var + 1}) - index
    return step.value if step.is_const else None


def plan_tiles(kernel: Kernel) -> TilePlan | None:
    reduces = [n for n in walk(kernel.value) if isinstance(n, Reduce)]
    if len(reduces) != 1 or not kernel.shape:
        return None
    red = reduces[0]
    body_loads = loads(red.body)
    if any(isinstance(n, Reduce) for n in walk(red.body)):
        return None
    if all(_stride(ld.index, red.var) in (0, 1) for ld in body_loads):
        return None  # reducing innermost already walks memory in order
    loop_vars = kernel.loop_vars
    i, j = (loop_vars[-2] if len(loop_vars) > 1 else None), loop_vars[-1]
    if any(_stride(ld.index, j) not in (0, 1) for ld in body_loads):
        return None
    rows, panels = [], []

    def split(e):
        deps = depends_on(e)
        if isinstance(e, Const):
            return
        if j.name not in deps:
            rows.append(e)
        elif i is not None and i.name not in deps:
            panels.append(e)
        elif isinstance(e, Apply):
            for a in e.args:
                split(a)
        elif isinstance(e, Select):
            split(e.value)
    split(red.body)
    rows, panels = list(dict.fromkeys(rows)), list(dict.fromkeys(panels))
    ti = _tile(kernel.shape[-2], TILE_ROWS) if i is not None else 1
    return TilePlan(red, i, j, ti, _tile(kernel.shape[-1], TILE_COLS), rows, panels)


def _tile(extent: Expr, preferred: int) -> int:
    return min(preferred, extent.value) if extent.is_const and extent.value > 0 else preferred


def render_tiled(program: KernelProgram, kernel: Kernel, plan: TilePlan) -> list[str]:
    red, i, j, ti, tj = plan.reduce, plan.i, plan.j, plan.ti, plan.tj
    rows_n, cols_n, k_n = (kernel.shape[-2] if i is not None else sym(1)), kernel.shape[-1], red.extent
    r, k_c = red.var.name, red.extent.render_c()
    outer = list(zip(kernel.loop_vars[:-2 if i is not None else -1], kernel.shape))
    prim = PRIMITIVES[red.op]
    npan = len(plan.panels)

    def clamp(var, base, offset, extent, tile):
        if extent.is_const and extent.value % tile == 0:
            return f"const long long {var.name} = {base} + {offset};"
        return f"const long long {var.name} = {base} + {offset} < {extent.render_c()} ? {base} + {offset} : {extent.render_c()} - 1;"

    work = numel(kernel.shape) * k_n
    out = [f"    #pragma omp parallel if(({work.render_c()}) >= {PARALLEL_MIN_WORK})", "    {"]
    if npan:
        out.append(f"    float *restrict pan = (float *)malloc(sizeof(float) * (size_t)({k_c}) * {tj * npan});")
    out.append(f"    #pragma omp for collapse({len(outer) + 2}) schedule(static)")
    for var, extent in outer:
        out.append(f"    for (long long {var.name} = 0; {var.name} < {extent.render_c()}; {var.name}++)")
    out.append(f"    for (long long j0 = 0; j0 < {cols_n.render_c()}; j0 += {tj})")
    out.append(f"    for (long long ic = 0; ic < {rows_n.render_c()}; ic += {ROW_CHUNK}) {{")
    if npan:  # copy (and convert/compute) the panel operands once per column block
        out += [f"      for (long long {r} = 0; {r} < {k_c}; {r}++)",
                "        #pragma omp simd", f"        for (long long jj = 0; jj < {tj}; jj++) {{",
                f"          {clamp(j, 'j0', 'jj', cols_n, tj)}"]
        em = _Emitter(program, "          ")
        for p, node in enumerate(plan.panels):
            out_v = em.emit(node)
            em.lines.append(f"          pan[({p} * {k_c} + {r}) * {tj} + jj] = {out_v};")
        out += em.lines + ["        }"]
    out.append(f"      for (long long i0 = ic; i0 < ic + {ROW_CHUNK} && i0 < {rows_n.render_c()}; i0 += {ti}) {{")
    out.append(f"        float acc[{ti}][{tj}];")
    out.append(f"        for (int ii = 0; ii < {ti}; ii++) for (int jj = 0; jj < {tj}; jj++) "
               f"acc[ii][jj] = {render_float(prim.identity)};")
    out.append(f"        for (long long {r} = 0; {r} < {k_c}; {r}++) {{")
    names = {node: f"pan[({p} * {k_c} + {r}) * {tj} + jj]" for p, node in enumerate(plan.panels)}
    if plan.rows:
        out.append("          " + " ".join(f"float row{q}[{ti}];" for q in range(len(plan.rows))))
        out.append(f"          #pragma GCC unroll {ti}")
        out.append(f"          for (int ii = 0; ii < {ti}; ii++) {{")
        if i is not None:
            out.append(f"            {clamp(i, 'i0', 'ii', rows_n, ti)}")
        em = _Emitter(program, "            ")
        for q, node in enumerate(plan.rows):
            em.lines.append(f"            row{q}[ii] = {em.emit(node)};")
        out += em.lines + ["          }"]
        names.update({node: f"row{q}[ii]" for q, node in enumerate(plan.rows)})
    out += [f"          #pragma GCC unroll {ti}", f"          for (int ii = 0; ii < {ti}; ii++) {{",
            "            #pragma omp simd", f"            for (int jj = 0; jj < {tj}; jj++) {{"]
    em = _Emitter(program, "              ")
    em.names.update(names)
    inner_deps = _deps_outside(red.body, names)
    if i is not None and i.name in inner_deps:
        em.lines.append(f"              {clamp(i, 'i0', 'ii', rows_n, ti)}")
    if j.name in inner_deps:
        em.lines.append(f"              {clamp(j, 'j0', 'jj', cols_n, tj)}")
    value = em.emit(red.body)
    out += em.lines + [f"              acc[ii][jj] = {prim.c.format('acc[ii][jj]', value)};", "            }", "          }",
                       "        }"]
    # store, applying whatever elementwise work follows the reduction in this kernel
    out.append(f"        for (int ii = 0; ii < {ti}; ii++) for (int jj = 0; jj < {tj}; jj++) {{")
    bounds = []
    if i is not None:
        out.append(f"          const long long {i.name} = i0 + ii;")
        bounds.append(f"{i.name} < {rows_n.render_c()}")
    out.append(f"          const long long {j.name} = j0 + jj;")
    bounds.append(f"{j.name} < {cols_n.render_c()}")
    out.append(f"          if ({' && '.join(bounds)}) {{")
    em = _Emitter(program, "            ")
    em.names[red] = "acc[ii][jj]"
    value = em.emit(kernel.value)
    out += em.lines + [f"            b{kernel.out}[{flat_index(kernel.loop_vars, kernel.shape).render_c()}] = {value};",
                       "          }", "        }", "      }", "    }"]
    if npan:
        out.append("    free(pan);")
    out.append("    }")
    return out


def _deps_outside(e, named: dict) -> frozenset:
    """Variables `e` depends on, not counting subtrees that already have a name."""
    if e in named:
        return frozenset()
    if isinstance(e, Apply):
        return frozenset().union(*(_deps_outside(a, named) for a in e.args))
    if isinstance(e, Select):
        return e.cond.vars() | _deps_outside(e.value, named)
    return depends_on(e)


def render_program(program: KernelProgram) -> str:
    """All kernels plus two entry points: lm_run, and lm_run_profiled that also times each kernel."""
    parts = [PRELUDE] + [render_kernel(program, k) for k in program.kernels]
    calls = "\n".join(f"    {k.name}(bufs, dims);" for k in program.kernels)
    timed = "\n".join(f"    t = omp_get_wtime(); {k.name}(bufs, dims); seconds[{i}] = omp_get_wtime() - t;"
                      for i, k in enumerate(program.kernels))
    parts.append(f"void lm_run(void **bufs, const long long *dims) {{\n{calls}\n}}\n")
    parts.append(f"void lm_run_profiled(void **bufs, const long long *dims, double *seconds) {{\n"
                 f"    double t; (void)t;\n{timed}\n}}\n")
    return "\n\n".join(parts)


def _reduce_work(e) -> Expr:
    """Iterations of the innermost reductions per output element (1 when there are none)."""
    work = sym(1)
    for node in walk(e):
        if isinstance(node, Reduce):
            work = work * node.extent
    return work


class CPUProgram(Program):
    """A graph compiled to one shared object; calling it runs every kernel in one C call.

    LUMINAR_DEBUG=1 prints each call's per-kernel times, 2 also the generated C at compile
    time, 3 also the kernel IR.
    """
    backend = "cpu"
    MAX_PLANS = 64  # memory plans kept for distinct dim values (a growing KV cache makes many)

    def __init__(self, graph, **options):
        super().__init__(graph)
        if options:
            raise UnsupportedError(f"cpu backend: unknown options {sorted(options)}")
        self.debug = int(os.environ.get("LUMINAR_DEBUG", "0") or 0)
        self.kernels = lower(graph)
        self.source = render_program(self.kernels)
        started = time.perf_counter()
        self.library = cc.load(self.source)
        self.compile_seconds = time.perf_counter() - started
        self._run = self.library.lm_run
        self._run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self._run.restype = None
        self._run_profiled = self.library.lm_run_profiled
        self._run_profiled.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._run_profiled.restype = None
        self._plans: dict[tuple, MemoryPlan] = {}
        self._lifetimes = lifetimes(self.kernels)
        self._arena = np.empty(0, np.float32)
        if self.debug >= 3:
            for k in self.kernels.kernels:
                print(f"[luminar] IR {k.name} {k.shape}: {k.value}", file=sys.stderr)
        if self.debug >= 2:
            print(self.source, file=sys.stderr)
        if self.debug >= 1:
            print(f"[luminar] cpu: {len(self.kernels.kernels)} kernels, shared object ready in "
                  f"{self.compile_seconds * 1e3:.0f} ms", file=sys.stderr)

    def memory_plan(self, env: dict[str, int], exact: bool = False) -> MemoryPlan:
        """The arena layout for these dim values. Calls plan for dims rounded up to a power of two,
        so a growing KV cache re-plans only when it doubles; `exact` plans for the values given."""
        bucket = dict(env) if exact else {d: 1 << max(int(v) - 1, 0).bit_length() for d, v in env.items()}
        key = (exact, *(bucket.get(d, 0) for d in self.kernels.dims))
        if key not in self._plans:
            if len(self._plans) >= self.MAX_PLANS:
                self._plans.clear()
            self._plans[key] = plan_memory(self.kernels, bucket, life=self._lifetimes)
        return self._plans[key]

    def execute(self, arrays, env):
        kp = self.kernels
        plan = self.memory_plan(env)
        if self._arena.nbytes < plan.arena_bytes + ALIGN:  # one arena, grown to the largest plan
            self._arena = np.empty((plan.arena_bytes + ALIGN) // 4, np.float32)
        base = self._arena.ctypes.data + (-self._arena.ctypes.data) % ALIGN
        pointers = (ctypes.c_void_p * len(kp.buffers))()
        results = {}
        for name, buf in kp.inputs.items():
            pointers[buf] = arrays[name].ctypes.data
        for name, buf in kp.outputs.items():
            results[name] = np.empty(tuple(int(d.evaluate(env)) for d in kp.output_shapes[name]), np.float32)
            pointers[buf] = results[name].ctypes.data
        for buf, offset in plan.offsets.items():
            pointers[buf] = base + offset
        dims = (ctypes.c_longlong * max(len(kp.dims), 1))(*[env[d] for d in kp.dims])
        if self.debug >= 1:
            self._profile(pointers, dims)
        else:
            self._run(pointers, dims)
        return results

    def _profile(self, pointers, dims):
        seconds = (ctypes.c_double * max(len(self.kernels.kernels), 1))()
        self._run_profiled(pointers, dims, seconds)
        total = sum(seconds[:len(self.kernels.kernels)])
        print(f"[luminar] cpu call: {total * 1e3:.3f} ms in {len(self.kernels.kernels)} kernels", file=sys.stderr)
        for k, t in zip(self.kernels.kernels, seconds):
            print(f"[luminar]   {t * 1e3:9.3f} ms  {k.name} {tuple(str(d) for d in k.shape)}", file=sys.stderr)
