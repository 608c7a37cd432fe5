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

import numpy as np

from ..compiler.kernels import Apply, Const, IndexValue, Kernel, KernelProgram, Load, Reduce, Select, lower
from ..compiler.memory import ALIGN, plan_memory
from ..ops import PRIMITIVES
from ..program import Program
from ..symbolic import C_HELPERS, Expr, sym
from . import cc

C_TYPES = {"float32": "float", "float16": "_Float16", "bfloat16": "unsigned short", "int8": "signed char",
           "uint8": "unsigned char", "int32": "int"}
PARALLEL_MIN_WORK = 1 << 15  # below this many inner iterations a kernel runs on one thread

PRELUDE = f"""\
#include <math.h>
#include <stdint.h>
{C_HELPERS}
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

    def __init__(self, program: KernelProgram, indent: str):
        self.program, self.indent = program, indent
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
            code = PRIMITIVES[e.op].c.format(*(self.emit(a) for a in e.args))
        elif isinstance(e, Select):
            code = f"(({e.cond.render_c()}) ? {self.emit(e.value)} : 0.0f)"
        elif isinstance(e, Reduce):
            code = self.reduce(e)
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

    def reduce(self, e: Reduce) -> str:
        prim = PRIMITIVES[e.op]
        acc = self.fresh("acc")
        self.lines.append(f"{self.indent}float {acc} = {render_float(prim.identity)};")
        self.lines.append(f"{self.indent}for (long long {e.var.name} = 0; {e.var.name} < {e.extent.render_c()}; "
                          f"{e.var.name}++) {{")
        inner = _Emitter(self.program, self.indent + "    ")
        inner.names, inner.count = dict(self.names), self.count  # reuse values computed outside the loop
        value = inner.emit(e.body)
        self.lines += inner.lines
        self.count = inner.count
        self.lines.append(f"{self.indent}    {acc} = {prim.c.format(acc, value)};")
        self.lines.append(f"{self.indent}}}")
        return acc


def render_kernel(program: KernelProgram, kernel: Kernel) -> str:
    """One C function computing `kernel` over its whole output."""
    used = sorted({load.buffer for load in _loads(kernel.value)} | {kernel.out})
    lines = [f"static void {kernel.name}(void **restrict bufs, const long long *restrict dims) {{"]
    lines += [f"    const long long {d} = dims[{i}];" for i, d in enumerate(program.dims)]
    for b in used:
        ctype = C_TYPES[program.buffers[b].dtype]
        const = "" if b == kernel.out else "const "
        lines.append(f"    {const}{ctype} *restrict b{b} = ({const}{ctype} *)bufs[{b}];")
    for d in program.dims:
        lines.append(f"    (void){d};")
    loop_vars = kernel.loop_vars
    depth = len(kernel.shape)
    work = _numel(kernel.shape) * _reduce_work(kernel.value)
    if depth:
        collapse = max(depth - 1, 1)
        lines.append(f"    #pragma omp parallel for collapse({collapse}) schedule(static) "
                     f"if(({work.render_c()}) >= {PARALLEL_MIN_WORK})")
    indent = "    "
    for var, extent in zip(loop_vars, kernel.shape):
        lines.append(f"{indent}for (long long {var.name} = 0; {var.name} < {extent.render_c()}; {var.name}++)")
    lines.append(f"{indent}{{")
    emitter = _Emitter(program, indent + "    ")
    value = emitter.emit(kernel.value)
    lines += emitter.lines
    flat = sum((v * s for v, s in zip(loop_vars, _strides(kernel.shape))), sym(0))
    lines.append(f"{indent}    b{kernel.out}[{flat.render_c()}] = {value};")
    lines.append(f"{indent}}}")
    lines.append("}")
    return "\n".join(lines)


def render_program(program: KernelProgram) -> str:
    parts = [PRELUDE] + [render_kernel(program, k) for k in program.kernels]
    calls = "\n".join(f"    {k.name}(bufs, dims);" for k in program.kernels)
    parts.append(f"void lm_run(void **bufs, const long long *dims) {{\n{calls}\n}}\n")
    return "\n\n".join(parts)


def _loads(e):
    from ..compiler.kernels import loads
    return loads(e)


def _numel(shape) -> Expr:
    n = sym(1)
    for d in shape:
        n = n * d
    return n


def _strides(shape):
    from ..shape import row_major_strides
    return row_major_strides(shape)


def _reduce_work(e) -> Expr:
    """Iterations of the innermost reductions per output element (1 when there are none)."""
    from ..compiler.kernels import walk
    work = sym(1)
    for node in walk(e):
        if isinstance(node, Reduce):
            work = work * node.extent
    return work


class CPUProgram(Program):
    backend = "cpu"

    def __init__(self, graph, **options):
        super().__init__(graph)
        if options:
            from ..errors import UnsupportedError
            raise UnsupportedError(f"cpu backend: unknown options {sorted(options)}")
        self.kernels = lower(graph)
        self.source = render_program(self.kernels)
        self.library = cc.load(self.source)
        self._run = self.library.lm_run
        self._run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self._run.restype = None
        self._plans: dict[tuple, tuple] = {}

    def memory_plan(self, env: dict[str, int]):
        """The arena layout for these dim values (planned once per distinct dims)."""
        key = tuple(env.get(d, 0) for d in self.kernels.dims)
        if key not in self._plans:
            plan = plan_memory(self.kernels, env)
            arena = np.empty(plan.arena_bytes // 4 + ALIGN // 4, np.float32)
            self._plans[key] = (plan, arena)
        return self._plans[key]

    def execute(self, arrays, env):
        kp = self.kernels
        plan, arena = self.memory_plan(env)
        base = arena.ctypes.data + (-arena.ctypes.data) % ALIGN
        pointers = (ctypes.c_void_p * len(kp.buffers))()
        results = {}
        for name, buf in kp.inputs.items():
            pointers[buf] = arrays[name].ctypes.data
        for name, buf in kp.outputs.items():
            shape = tuple(int(d.evaluate(env)) for d in kp.output_shapes[name])
            if name not in results:
                results[name] = np.empty(shape, np.float32)
            pointers[buf] = results[name].ctypes.data
        for buf, offset in plan.offsets.items():
            pointers[buf] = base + offset
        dims = (ctypes.c_longlong * max(len(kp.dims), 1))(*[env[d] for d in kp.dims])
        self._run(pointers, dims)
        return results
