"""GPU kernels as source: each kernel in its form (schedules.py), in a dialect (dialect.py).

`Emitter` turns IR expressions into statements (each distinct subexpression named once, as the
CPU target's emitter does: OpenCL C is C99). `render_kernel` writes one kernel function in the
form its schedule names; `launch` gives the work sizes of a call for the dims' values;
`render_program` is every kernel of a program as one source (kernels equal up to their buffers
share a function) plus the calls to make, in order.

Every kernel function takes, for each buffer it touches, a base pointer and an element offset
(temporaries live in one arena buffer; inputs and outputs in their own, at offset 0), then every
symbolic dim of the program as a 64-bit integer.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from ...compiler.analysis import TilePlan, plan_tiles
from ...compiler.online import online_plan
from ...compiler.kernels import (Apply, Const, Gather, IndexValue, Kernel, KernelProgram, Load, Reduce, Select,
                                 canonical_form, depends_on, flat_index, loads, numel, split_reductions)
from ...ops import PRIMITIVES
from ...symbolic import Var, sym
from .dialect import OPENCL, Dialect
from .schedules import Grid, Online, Rows, Schedule, Split, Tiled, default_schedule, hoisted_rows
from .vector import LANE_NAMES, LANES, vector_loads


def render_float(v: float) -> str:
    if v != v:
        return "NAN"
    if v in (float("inf"), float("-inf")):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"{float(np.float32(v))!r}f"


class Emitter:
    """Turns an IR expression into statements, naming each distinct subexpression once."""

    def __init__(self, program: KernelProgram, dialect: Dialect, indent: str, names: dict | None = None,
                 vector: bool = False):
        self.program, self.dialect, self.indent = program, dialect, indent
        self.vector = vector and bool(dialect.load4)  # serial reductions with vector loads where vector.py allows
        self.lines: list[str] = []
        self.names: dict = dict(names or {})  # IR node -> its name, known on entry
        self.count = [0]  # shared with child emitters: names stay unique in the function

    def fresh(self, prefix="v") -> str:
        self.count[0] += 1
        return f"{prefix}{self.count[0]}"

    def child(self, indent: str = "    ") -> Emitter:
        inner = Emitter(self.program, self.dialect, self.indent + indent, self.names, self.vector)
        inner.count = self.count
        return inner

    def block(self, e) -> str:
        """Emit `e` one level deeper (inside a loop or an if), seeing what is named here."""
        inner = self.child()
        value = inner.emit(e)
        self.lines += inner.lines
        return value

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
            code = self.power_of_two_mod(e) or PRIMITIVES[e.op].c.format(*(self.emit(a) for a in e.args))
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

    def power_of_two_mod(self, e: Apply) -> str | None:
        """fmod by a constant power of two >= 1 in the dialect's exact spelling, else None."""
        if e.op != "mod" or not self.dialect.pow2_mod or not isinstance(e.args[1], Const):
            return None
        b = abs(e.args[1].value)
        if not (1 <= b < float("inf") and np.frexp(b)[0] == 0.5):
            return None
        return self.dialect.pow2_mod.format(self.emit(e.args[0]), render_float(b), render_float(1.0 / b))

    def load(self, e: Load) -> str:
        buf = self.program.buffers[e.buffer]
        read = self.dialect.load(buf.dtype, f"b{buf.id}", e.index.render_c())
        return read if e.valid == sym(1) else f"(({e.valid.render_c()}) ? {read} : 0.0f)"

    def hoist(self, body, var: str):
        """Emit the parts of `body` that do not depend on loop variable `var` before the loop."""
        if isinstance(body, Const) or body in self.names:
            return
        if var not in depends_on(body):
            self.emit(body)
        elif isinstance(body, Apply):
            for a in body.args:
                self.hoist(a, var)
        elif isinstance(body, Select):
            self.hoist(body.value, var)

    def reduce(self, e: Reduce) -> str:
        """A reduction as a serial loop in the work-item (with vector loads when allowed)."""
        prim, ix = PRIMITIVES[e.op], self.dialect.index
        self.hoist(e.body, e.var.name)
        acc = self.fresh("acc")
        self.lines.append(f"{self.indent}float {acc} = {render_float(prim.identity)};")
        vectors = vector_loads(self.program, e) if self.vector else None
        if vectors:
            self.vector_loop(e, vectors, acc, "0", LANES)
            return acc
        self.lines.append(f"{self.indent}for ({ix} {e.var.name} = 0; {e.var.name} < {e.extent.render_c()}; "
                          f"{e.var.name}++) {{")
        value = self.block(e.body)
        self.lines += [f"{self.indent}    {acc} = {prim.c.format(acc, value)};", f"{self.indent}}}"]
        return acc

    def vector_loop(self, e: Reduce, vectors: list[Load], acc: str, start: str, step: int) -> None:
        """Accumulate `e` into `acc` over r = start, start + step, ... in runs of LANES steps: each
        of `vectors` read once per run (the dialect's load4), the LANES steps then in order, each
        from its lane (vector.py)."""
        d, r, prim = self.dialect, e.var.name, PRIMITIVES[e.op]
        base, indent = Var("_" + self.fresh("lanes")), self.indent
        self.lines.append(f"{indent}for ({d.index} {base.name} = {start}; {base.name} < {e.extent.render_c()}; "
                          f"{base.name} += {step}) {{")
        lanes = {}
        for load in vectors:
            lanes[load] = self.fresh("vec")
            address = load.index.substitute({r: base}).render_c()
            self.lines.append(f"{indent}    const {d.float4} {lanes[load]} = "
                              f"{d.load4.format(f'b{self.program.buffers[load.buffer].id}', address)};")
        for lane in range(LANES):
            inner = self.child("        ")
            inner.names.update({load: f"{name}.{LANE_NAMES[lane]}" for load, name in lanes.items()})
            value = inner.emit(e.body)
            self.lines += [f"{indent}    {{", f"{indent}        const {d.index} {r} = {base.name} + {lane};"] + \
                inner.lines + [f"{indent}        {acc} = {prim.c.format(acc, value)};", f"{indent}    }}"]
        self.lines.append(f"{indent}}}")

    def gather(self, e: Gather) -> str:
        """The body evaluated once, at the integer the index holds (0.0 when it is not a valid index)."""
        out, index = self.fresh("gather"), self.emit(e.index)
        self.lines.append(f"{self.indent}float {out} = 0.0f;")
        self.lines.append(f"{self.indent}if ({index} >= 0.0f && {index} < (float)({e.extent.render_c()}) && "
                          f"{index} == (float)({self.dialect.index}){index}) {{")
        self.lines.append(f"{self.indent}    const {self.dialect.index} {e.var.name} = ({self.dialect.index}){index};")
        value = self.block(e.body)
        self.lines += [f"{self.indent}    {out} = {value};", f"{self.indent}}}"]
        return out


# -- one kernel ------------------------------------------------------------------------------------
def signature(program: KernelProgram, kernel: Kernel, dialect: Dialect, name: str) -> list[str]:
    """The function header and its pointer set-up: a base and an offset per buffer, then the dims."""
    used = sorted({ld.buffer for ld in loads(kernel.value)} | {kernel.out})
    params, setup = [], []
    for b in used:
        ctype = dialect.types[program.buffers[b].dtype]
        const = "" if b == kernel.out else "const "
        params += [f"{dialect.global_ptr} {const}{ctype} *b{b}_base", f"const {dialect.index} b{b}_off"]
        setup.append(f"    {dialect.global_ptr} {const}{ctype} *b{b} = b{b}_base + b{b}_off;")
    if dialect.dims_in_memory:
        params.append(f"{dialect.global_ptr} const {dialect.index} *lm_dims")
        setup += [f"    const {dialect.index} {Var(d).render_c()} = lm_dims[{k}];" for k, d in enumerate(program.dims)]
    else:
        params += [f"const {dialect.index} {Var(d).render_c()}" for d in program.dims]  # (lm_dim_ names, as render_c spells them)
    return [f"{dialect.kernel} {name}({', '.join(params)}) {{"] + setup


def _unflatten(flat: str, variables, extents, dialect: Dialect, indent: str = "    ") -> list[str]:
    """Declare `variables` (row-major over `extents`) from the flat index `flat`."""
    lines, rest = [], flat
    for k, (var, extent) in enumerate(reversed(list(zip(variables, extents)))):
        if k == len(variables) - 1:
            lines.append(f"{indent}const {dialect.index} {var.name} = {rest};")
        else:
            lines.append(f"{indent}const {dialect.index} {var.name} = {rest} % ({extent.render_c()});")
            lines.append(f"{indent}const {dialect.index} lm_q{k} = {rest} / ({extent.render_c()});")
            rest = f"lm_q{k}"
    return lines


def render_grid(program, kernel, schedule: Grid, d: Dialect) -> list[str]:
    """An output element per work-item; reductions serial."""
    n = numel(kernel.shape)
    lines = [f"    const {d.index} lm_flat = ({d.index}){d.group_id.format(0)} * {schedule.local} + "
             f"({d.index}){d.local_id.format(0)};",
             f"    if (lm_flat >= {n.render_c()}) return;"]
    lines += _unflatten("lm_flat", kernel.loop_vars, kernel.shape, d)
    em = Emitter(program, d, "    ", vector=schedule.vector > 1)
    value = em.emit(split_reductions(kernel.value))
    return lines + em.lines + [f"    b{kernel.out}[lm_flat] = {value};"]


def render_sampled(program: KernelProgram, kernel: Kernel, dialect: Dialect, name: str) -> str:
    """`name(buffers.., dims.., which, count, samples)`: the kernel's value at `count` flat output
    positions `which`, one per work-item, each by the plain loop body (reductions serial): the
    semantics candidates are checked against, affordable where the whole plain form is not (a
    row kernel's plain form recomputes its row values for every element)."""
    d = dialect
    head = signature(program, kernel, d, name)
    head[0] = head[0].replace(") {", f", {d.global_ptr} const {d.index} *lm_which, const {d.index} lm_count, "
                                     f"{d.global_ptr} float *lm_samples) {{")
    lines = [f"    const {d.index} lm_n = ({d.index}){d.group_id.format(0)} * {d.local_size.format(0)} + "
             f"({d.index}){d.local_id.format(0)};",
             "    if (lm_n >= lm_count) return;", f"    const {d.index} lm_flat = lm_which[lm_n];"]
    lines += _unflatten("lm_flat", kernel.loop_vars, kernel.shape, d)
    em = Emitter(program, d, "    ")
    value = em.emit(split_reductions(kernel.value))
    return "\n".join(head + lines + em.lines + [f"    lm_samples[lm_n] = {value};", "}"])


def render_rows(program, kernel, schedule: Rows, d: Dialect) -> list[str]:
    """A work-group per row: row values reduced across it (local memory, a halving tree of
    barriers), then every `local`-th element of the row per work-item."""
    size, inner = schedule.local, kernel.loop_vars[-1]
    lines = [f"    {d.local_array} float lm_part[{size}];",
             f"    const {d.index} lm_row = ({d.index}){d.group_id.format(0)};",
             f"    const int lm_lid = (int){d.local_id.format(0)};"]
    if d.dims_in_memory:  # (the launch may round dims up: the extra work-groups leave, all their items alike)
        lines.append(f"    if (lm_row >= {numel(kernel.shape[:-1]).render_c()}) return;")
    lines += _unflatten("lm_row", kernel.loop_vars[:-1], kernel.shape[:-1], d)
    em = Emitter(program, d, "    ", vector=schedule.vector > 1)
    for red in hoisted_rows(kernel):
        prim, acc = PRIMITIVES[red.op], em.fresh("part")
        em.hoist(red.body, red.var.name)
        em.lines.append(f"    float {acc} = {render_float(prim.identity)};")
        vectors = vector_loads(program, red) if em.vector else None
        if vectors:  # (each work-item's share: runs of LANES consecutive steps, every size-th run)
            em.vector_loop(red, vectors, acc, f"{LANES} * lm_lid", LANES * size)
        else:
            em.lines.append(f"    for ({d.index} {red.var.name} = lm_lid; {red.var.name} < {red.extent.render_c()}; "
                            f"{red.var.name} += {size}) {{")
            value = em.block(red.body)
            em.lines += [f"        {acc} = {prim.c.format(acc, value)};", "    }"]
        total = em.fresh("row")
        em.lines += subgroup_combine(prim, acc, d) if schedule.subgroups else [
            f"    lm_part[lm_lid] = {acc};", f"    {d.barrier}",
            f"    for (int lm_s = {size // 2}; lm_s > 0; lm_s >>= 1) {{",
            f"        if (lm_lid < lm_s) lm_part[lm_lid] = {prim.c.format('lm_part[lm_lid]', 'lm_part[lm_lid + lm_s]')};",
            f"        {d.barrier}", "    }"]
        em.lines += [f"    const float {total} = lm_part[0];", f"    {d.barrier}"]
        em.names[red] = total
    em.lines.append(f"    for ({d.index} {inner.name} = lm_lid; {inner.name} < {kernel.shape[-1].render_c()}; "
                    f"{inner.name} += {size}) {{")
    value = em.block(kernel.value)
    em.lines += [f"        b{kernel.out}[lm_row * ({kernel.shape[-1].render_c()}) + {inner.name}] = {value};", "    }"]
    return lines + em.lines


def subgroup_combine(prim, acc: str, d: Dialect) -> list[str]:
    """Combine every work-item's `acc` into lm_part[0]: within each sub-group by shuffles (a
    butterfly: after it every lane holds its sub-group's value), then the sub-groups' values in
    order by work-item 0 (deterministic; a work-group has a few sub-groups)."""
    sg, other = d.subgroups, "lm_other"
    return [f"    for (int lm_o = {sg.size} / 2; lm_o > 0; lm_o >>= 1) {{",
            f"        const float {other} = {sg.shuffle_xor.format(acc, 'lm_o')};  /* (every lane shuffles: not inside ?:) */",
            f"        {acc} = {prim.c.format(acc, other)};", "    }",
            f"    if ({sg.lane} == 0) lm_part[{sg.id}] = {acc};", f"    {d.barrier}",
            f"    if (lm_lid == 0) for (int lm_g = 1; lm_g < {sg.count}; lm_g++) "
            f"lm_part[0] = {prim.c.format('lm_part[0]', 'lm_part[lm_g]')};", f"    {d.barrier}"]


def render_tiled(program, kernel, plan: TilePlan, s: Tiled, d: Dialect) -> list[str]:
    """Work-groups of wi x wj work-items over (wi*ri) x (wj*rj) output blocks; each work-item
    accumulates its ri x rj outputs (rows li + wi*a, columns lj + wj*b) in registers over the
    reduction, its operands staged per `kt` steps in local memory (or computed per work-item)."""
    red, i, j = plan.reduce, plan.i, plan.j
    prim, ix = PRIMITIVES[red.op], d.index
    bi, bj = s.block
    M, N, K = kernel.shape[-2].render_c(), kernel.shape[-1].render_c(), red.extent.render_c()
    r = red.var.name
    nrow, npan = len(plan.rows), len(plan.panels)
    lines = []  # (local arrays are declared at the function's top level, as OpenCL C requires)
    if s.local and nrow:
        lines.append(f"    {d.local_array} float lm_rows[{nrow * bi * s.kt}];")
    if s.local and npan:
        lines.append(f"    {d.local_array} float lm_pans[{npan * bj * s.kt}];")
    lines += [f"    const int lm_lj = (int){d.local_id.format(0)}, lm_li = (int){d.local_id.format(1)};",
              f"    const {ix} lm_j0 = ({ix}){d.group_id.format(0)} * {bj}, lm_i0 = ({ix}){d.group_id.format(1)} * {bi};",
              f"    const {ix} lm_batch = ({ix}){d.group_id.format(2)};"]
    if d.dims_in_memory:  # (as in render_rows; rows and columns past the end are clamped and not stored)
        lines.append(f"    if (lm_batch >= {numel(kernel.shape[:-2]).render_c()}) return;")
    lines += _unflatten("lm_batch", kernel.loop_vars[:-2], kernel.shape[:-2], d)
    lines += [f"    float lm_acc[{s.ri}][{s.rj}];",
              f"    for (int lm_a = 0; lm_a < {s.ri}; lm_a++) for (int lm_b = 0; lm_b < {s.rj}; lm_b++) "
              f"lm_acc[lm_a][lm_b] = {render_float(prim.identity)};"]
    row_i = f"const {ix} {i.name} = min(lm_i0 + lm_li + {s.wi} * lm_a, ({ix})({M}) - 1);"
    col_j = f"const {ix} {j.name} = min(lm_j0 + lm_lj + {s.wj} * lm_b, ({ix})({N}) - 1);"
    em = Emitter(program, d, "    ")

    def update(names: dict, indent: str) -> list[str]:
        """The register tile's update for one reduction step, operands named by `names`."""
        body = Emitter(program, d, indent + "        ", {**em.names, **names})
        body.count = em.count
        value = body.emit(red.body)
        return [f"{indent}#pragma unroll", f"{indent}for (int lm_a = 0; lm_a < {s.ri}; lm_a++) {{",
                f"{indent}    {row_i}", f"{indent}    #pragma unroll",
                f"{indent}    for (int lm_b = 0; lm_b < {s.rj}; lm_b++) {{", f"{indent}        {col_j}"] + \
            body.lines + [f"{indent}        lm_acc[lm_a][lm_b] = {prim.c.format('lm_acc[lm_a][lm_b]', value)};",
                          f"{indent}    }}", f"{indent}}}"]

    if s.local:
        items, kt = s.wi * s.wj, s.kt
        lines += [f"    const int lm_lid = lm_li * {s.wj} + lm_lj;",
                  f"    for ({ix} lm_k0 = 0; lm_k0 < {K}; lm_k0 += {kt}) {{"]
        for what, count, nodes, var, extent, block, store in (
                ("rows", bi * kt, plan.rows, i, M, bi, lambda q: f"lm_rows[({q} * {bi} + lm_e) * {kt} + lm_k]"),
                ("pans", bj * kt, plan.panels, j, N, bj, lambda q: f"lm_pans[({q} * {kt} + lm_k) * {bj} + lm_e]")):
            if not nodes:
                continue
            stage = Emitter(program, d, "            ")
            stage.count = em.count
            values = [stage.emit(node) for node in nodes]
            corner = "lm_i0" if what == "rows" else "lm_j0"
            lines += [f"        for (int lm_t = lm_lid; lm_t < {count}; lm_t += {items}) {{",
                      f"            const int lm_e = lm_t {'/' if what == 'rows' else '%'} "
                      f"{kt if what == 'rows' else block}, lm_k = lm_t {'%' if what == 'rows' else '/'} "
                      f"{kt if what == 'rows' else block};",
                      f"            const {ix} {var.name} = min({corner} + lm_e, ({ix})({extent}) - 1);",
                      f"            const {ix} {r} = min(lm_k0 + lm_k, ({ix})({K}) - 1);"] + stage.lines + \
                [f"            {store(q)} = {v};" for q, v in enumerate(values)] + ["        }"]
        lines += [f"        {d.barrier}",
                  f"        const int lm_steps = ({ix})({K}) - lm_k0 < {kt} ? (int)(({ix})({K}) - lm_k0) : {kt};",
                  "        for (int lm_k = 0; lm_k < lm_steps; lm_k++) {",
                  f"            const {ix} {r} = lm_k0 + lm_k;"]
        names = {node: f"lm_rows[({q} * {bi} + lm_li + {s.wi} * lm_a) * {kt} + lm_k]" for q, node in enumerate(plan.rows)}
        names.update({node: f"lm_pans[({q} * {kt} + lm_k) * {bj} + lm_lj + {s.wj} * lm_b]"
                      for q, node in enumerate(plan.panels)})
        lines += update(names, "            ") + ["        }", f"        {d.barrier}", "    }"]
    else:
        lines.append(f"    for ({ix} {r} = 0; {r} < {K}; {r}++) {{")
        names = {}
        for what, nodes, tile, clamp, arr in (("rows", plan.rows, s.ri, row_i, "lm_a"),
                                              ("pans", plan.panels, s.rj, col_j, "lm_b")):
            if not nodes:
                continue
            lines.append("        " + " ".join(f"float lm_{what}{q}[{tile}];" for q in range(len(nodes))))
            stage = Emitter(program, d, "            ")
            stage.count = em.count
            values = [stage.emit(node) for node in nodes]
            lines += ["        #pragma unroll", f"        for (int {arr} = 0; {arr} < {tile}; {arr}++) {{",
                      f"            {clamp}"] + stage.lines + \
                [f"            lm_{what}{q}[{arr}] = {v};" for q, v in enumerate(values)] + ["        }"]
            names.update({node: f"lm_{what}{q}[{arr}]" for q, node in enumerate(nodes)})
        lines += update(names, "        ") + ["    }"]
    # the epilogue (what follows the reduction) per output, then the store
    out = Emitter(program, d, "            ", {red: "lm_acc[lm_a][lm_b]"})
    out.count = em.count
    value = out.emit(kernel.value)
    where = flat_index(kernel.loop_vars, kernel.shape).render_c()
    lines += [f"    for (int lm_a = 0; lm_a < {s.ri}; lm_a++) for (int lm_b = 0; lm_b < {s.rj}; lm_b++) {{",
              f"        const {ix} {i.name} = lm_i0 + lm_li + {s.wi} * lm_a, {j.name} = lm_j0 + lm_lj + {s.wj} * lm_b;",
              f"        if ({i.name} < {M} && {j.name} < {N}) {{"] + out.lines + \
        [f"            b{kernel.out}[{where}] = {value};", "        }", "    }"]
    return lines


def render_kernel(program: KernelProgram, kernel: Kernel, schedule: Schedule | None = None,
                  dialect: Dialect = OPENCL, name: str | None = None) -> str:
    """One kernel function computing `kernel` over its whole output, in `schedule`'s form."""
    schedule = schedule or default_schedule(kernel)
    lines = signature(program, kernel, dialect, name or kernel.name)
    if isinstance(schedule, Online):
        from .online import render_online
        plan = online_plan(kernel)
        if plan is None:
            raise ValueError(f"{kernel.name}: the online form needs an attention kernel (compiler/online.online_plan)")
        lines += render_online(program, kernel, plan, schedule, dialect)
    elif isinstance(schedule, Tiled):
        plan = plan_tiles(kernel)
        if plan is None or plan.i is None:
            raise ValueError(f"{kernel.name}: the tiled form needs a reduction with row x column structure")
        lines += render_tiled(program, kernel, plan, schedule, dialect)
    elif isinstance(schedule, Split):
        from .split import applies, render_split, scratch_params
        if not applies(kernel) or schedule.local & (schedule.local - 1):
            raise ValueError(f"{kernel.name}: the split form needs one long reduction, few outputs and a "
                             "power-of-two work-group")
        lines[0] = lines[0].replace(") {", f", {scratch_params(dialect)}) {{")
        lines += render_split(program, kernel, schedule, dialect)
    elif isinstance(schedule, Rows):
        if not hoisted_rows(kernel) or schedule.local & (schedule.local - 1):
            raise ValueError(f"{kernel.name}: the rows form needs row values and a power-of-two work-group")
        if schedule.subgroups and (dialect.subgroups is None or schedule.local < 32):
            raise ValueError(f"{kernel.name}: sub-group reductions need a device with sub-group shuffles "
                             f"({dialect.name} here has none) and work-groups of at least 32")
        lines += render_rows(program, kernel, schedule, dialect)
    elif hasattr(schedule, "render"):  # a form a target defines itself (the cuda target's tensor-core tiles)
        lines += schedule.render(program, kernel, dialect)
    else:
        lines += render_grid(program, kernel, schedule, dialect)
    return "\n".join(lines + ["}"])


def launch(kernel: Kernel, schedule: Schedule, env: dict) -> tuple[tuple, tuple] | None:
    """(global work size, work-group size) of a call at these dim values; None: nothing to compute."""
    value = lambda e: int(e.evaluate(env)) if not e.is_const else e.value  # noqa: E731
    if isinstance(schedule, Online):
        from .online import launch_online
        return launch_online(kernel, schedule, value)
    if isinstance(schedule, Split):
        from .split import launch_split
        return launch_split(kernel, schedule)
    if isinstance(schedule, Tiled):
        bi, bj = schedule.block
        rows, cols, batch = value(kernel.shape[-2]), value(kernel.shape[-1]), value(numel(kernel.shape[:-2]))
        if not rows * cols * batch:
            return None
        return (-(-cols // bj) * schedule.wj, -(-rows // bi) * schedule.wi, batch), (schedule.wj, schedule.wi, 1)
    if isinstance(schedule, Rows):
        rows = value(numel(kernel.shape[:-1]))
        return ((rows * schedule.local,), (schedule.local,)) if rows and value(kernel.shape[-1]) else None
    n = value(numel(kernel.shape))
    return ((-(-n // schedule.local) * schedule.local,), (schedule.local,)) if n else None


FEW_ROWS = 4  # a tiled kernel called with fewer output rows (a decode step) runs as Grid (see Call)


class Call(NamedTuple):
    """One kernel of the program as the runtime enqueues it."""
    kernel: Kernel
    buffers: list  # the program's buffer ids, in the order of the function's buffer parameters
    functions: list  # function name per shape bucket (one entry: every bucket)
    schedules: list  # the schedule of each
    # True: no search chose; schedules are [the default Tiled, Grid for calls with < FEW_ROWS rows]. A
    # tile of 16 rows computing one wastes 15/16 of its work-items, and on PoCL an element per work-item
    # measured 2.5x faster for a SmolLM2 decode step
    by_rows: bool = False
    scratch: int = 0  # 4-byte words of zero-initialized device scratch the call's split forms take (split.py)

    def pick(self, env: dict, bucket: int) -> int:
        """Which schedule (and function) runs a call with these dims; `bucket`: search.nearest_bucket's."""
        if self.by_rows:
            rows = self.kernel.shape[-2]
            return int((rows.value if rows.is_const else rows.evaluate(env)) < FEW_ROWS)
        return bucket if len(self.functions) > 1 else 0


def render_program(program: KernelProgram, chosen: dict | None = None, dialect: Dialect = OPENCL) -> tuple[str, list[Call]]:
    """Every kernel as one source, and the calls in order. `chosen` maps a kernel's name to a
    schedule or a list of them (one per shape bucket); missing kernels get the default rules (and a
    default Tiled kernel with a symbolic row count a Grid twin for few rows: see Call). Kernels
    equal up to the buffers they touch (canonical_form) share one function."""
    chosen = chosen or {}
    parts, functions, calls = [dialect.prelude], {}, []
    for kernel in program.kernels:
        canon, ids = canonical_form(kernel)
        picked = chosen.get(kernel.name) or default_schedule(kernel)
        by_rows = kernel.name not in chosen and isinstance(picked, Tiled) and not kernel.shape[-2].is_const
        picked = [picked, Grid()] if by_rows else picked if isinstance(picked, list) else [picked]
        names = []
        for schedule in picked:
            key = (canon.value, canon.out, canon.shape, schedule, tuple(program.buffers[b].dtype for b in ids))
            if key not in functions:
                functions[key] = f"lm_f{len(functions)}_{kernel.name.split('_', 1)[-1]}"
                view = dataclasses.replace(program, buffers=[dataclasses.replace(program.buffers[b], id=k)
                                                             for k, b in enumerate(ids)])
                parts.append(render_kernel(view, canon, schedule, dialect, functions[key]))
            names.append(functions[key])
        used = sorted({ld.buffer for ld in loads(canon.value)} | {canon.out})
        scratch = max((s.scratch(numel(kernel.shape).value) for s in picked if isinstance(s, Split)), default=0)
        calls.append(Call(kernel, [ids[b] for b in used], names, picked, by_rows, scratch))
    return "\n\n".join(parts) + "\n", calls
