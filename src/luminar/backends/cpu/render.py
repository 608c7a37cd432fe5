"""C for the CPU target: each kernel as one C function following its schedule, and the program.

`render_kernel` writes one kernel's function: plain loops (render_loops; row values hoisted
above the row loop, reductions in vector lanes), tiles (render_tiled: register tiles, packed
panels, vector micro-kernels) or the online-softmax kernel (online.py). `_Emitter` turns IR
expressions into C statements. `render_program` is every kernel plus the entry points, with a
schedule per shape bucket dispatched on the call's dims where the search chose several.
`render_oracle` is the plain loop body at chosen output positions: the search's semantics.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ...compiler.analysis import PRECOMPUTED, TilePlan, plan_tiles, reduce_work, row_values, stride, vector_body, windowed
from ...compiler.kernels import (TRANSCENDENTAL, Apply, Buffer, Const, Gather, IndexValue, Kernel, KernelProgram, Load,
                                 Reduce, Select, _ir_exprs, canonical_form, depends_on, digits,
                                 flat_index, loads, numel, rebuild, split_reductions, substitute, walk)
from ...compiler.online import online_plan
from ...dtypes import STORAGE
from ...ops import PRIMITIVES
from ...symbolic import C_HELPERS, Var, sym
from . import cc
from .online import render_online
from .schedules import PARALLEL_MIN_WORK, Loops, Online, Schedule, Tiled, default_loops, default_schedule

C_TYPES = {"float32": "float", "float16": "unsigned short", "bfloat16": "unsigned short", "int8": "signed char",
           "uint8": "unsigned char", "int32": "int"}
# The C helpers of generated kernels are C, in prelude.h beside this file (the integer block dots,
# half-to-float conversions, inline exp2); before them the includes and the vector width.
PRELUDE = f"""\
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
{C_HELPERS}
typedef float lm_vec __attribute__((vector_size({4 * cc.VECTOR_LANES})));  /* one SIMD register of floats */
""" + (Path(__file__).parent / "prelude.h").read_text()


def render_float(v: float) -> str:
    if v != v:
        return "NAN"
    if v in (float("inf"), float("-inf")):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"{float(np.float32(v))!r}f"


class _Emitter:
    """Turns an IR expression into C statements, naming each distinct subexpression once."""

    def __init__(self, program: KernelProgram, indent: str, threaded_reduce: bool = False, lanes: int = 1,
                 names: dict | None = None, count: list | None = None):
        self.program, self.indent = program, indent
        self.threaded_reduce = threaded_reduce  # split the first reduction across threads (scalar outputs)
        self.lanes = lanes  # partial accumulators of innermost reductions (Schedule.lanes)
        self.stash: dict = {}  # Reduce -> where each step also stores its body's value (see render_loops)
        self.next_row = None  # a row loop's Var: split reductions prefetch the next row's operands
        self.lines: list[str] = []
        self.names: dict = dict(names or {})  # IR node -> its C name (or a Fixed), known on entry
        self.count = count or [0]  # shared with child emitters: names stay unique in the function
        self.int_type = "int"  # what a Fixed is named as: lm_b16 where 16 bytes are unpacked at once (bytes16)

    def fresh(self, prefix="v") -> str:
        self.count[0] += 1
        return f"{prefix}{self.count[0]}"

    def emit(self, e) -> str:
        if e in self.names:
            return self.names[e]
        if isinstance(e, Const):
            return render_float(e.value)
        if isinstance(e, IndexValue):
            # (not (float) of the long long: AVX2 converts 32-bit integers to floats, not 64-bit ones,
            # so that kept a loop with a position mask from vectorizing -- the causal attention
            # scores' epilogue. lm_index_float sums two exact halves, which round once: the same
            # float as (float)x for |x| < 2^48.)
            code = f"lm_index_float({e.expr.render_c()})"
        elif isinstance(e, Load):
            code = self.load(e)
        elif isinstance(e, Apply) and e.op == "exp2":
            code = f"lm_exp2({self.emit(e.args[0])})"
        elif isinstance(e, Apply) and e.op in ("add", "sum_reduce") and len(_vector_leaves(e) or ()) > 1:
            code = self.sum_in_vector([(None, _vector_leaves(e))])
        elif isinstance(e, Apply) and e.op == "mod" and (fixed := self.fixed(e)):
            code = f"(float){fixed.code}" + (f" * {render_float(2.0 ** -fixed.k)}" if fixed.k else "")
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

    def fixed(self, e) -> Fixed | None:
        """`e` as an exact integer over a power of two (a Fixed), provably: bytes loaded from
        int8/uint8 buffers, scaled by powers of two, fmod by powers of two, floor spelled
        x - fmod(x, 1), sums. Such values render as int arithmetic (& instead of fmod), exact where
        the float ops are (every value below 2^24) and vectorizable: how quantized weights' nibbles
        are unpacked. None otherwise."""
        key = ("fixed", e)
        if key not in self.names:
            found = _fixed(e, self)
            # (an lm_b16 vector computes mod 256: exact for + and -, not for >> of a value above 255)
            if found and not (-_EXACT < found.lo <= found.hi < (_EXACT if self.int_type == "int" else 256)
                              and 0 <= found.k < 64):
                found = None
            if found and not found.code.isidentifier():
                name = self.fresh("i")
                self.lines.append(f"{self.indent}const {self.int_type} {name} = {found.code};")
                found = found._replace(code=name)
            self.names[key] = found
        return self.names[key]

    def load(self, e: Load) -> str:
        buf = self.program.buffers[e.buffer]
        read = f"b{buf.id}[{e.index.render_c()}]"
        read = _READS.get(buf.dtype, "(float){}").format(read)
        return read if e.valid == sym(1) else f"(({e.valid.render_c()}) ? {read} : 0.0f)"

    def emit_block(self, e) -> str:
        """Emit `e` one level deeper (inside a loop or an if), reusing values already computed here."""
        inner = self.child("    ")
        value = inner.emit(e)
        self.lines += inner.lines
        return value

    def hoist(self, body, var: str):
        """Emit the parts of `body` that do not depend on loop variable `var` here, before the loop
        (loop-invariant code motion: a norm's reduction inside a matmul's body runs once per row)."""
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
        prim = PRIMITIVES[e.op]
        self.hoist(e.body, e.var.name)
        if e.op == "sum_reduce" and not self.threaded_reduce and e not in self.stash and (terms := _block_dot(e, self)):
            return self.block_dot(e, terms)
        if e.op == "sum_reduce" and not self.threaded_reduce and _vector_leaves(e.body) and e not in self.stash:
            return self.sum_in_vector([(None, _vector_leaves(e.body))], e)
        acc = self.fresh("acc")
        self.lines.append(f"{self.indent}float {acc} = {render_float(prim.identity)};")
        if self.threaded_reduce:
            self.threaded_reduce = False
            op = "+" if e.op == "sum_reduce" else "max"
            self.lines.append(f"{self.indent}#pragma omp parallel for reduction({op}:{acc}) schedule(static) "
                              f"if(({(e.extent * reduce_work(e.body)).render_c()}) >= {PARALLEL_MIN_WORK})")
        elif self.lanes > 1 and not any(isinstance(n, (Reduce, Gather)) for n in walk(e.body, skip=self.names)):
            return self.reduce_in_lanes(e, acc)
        self.lines.append(f"{self.indent}for (long long {e.var.name} = 0; {e.var.name} < {e.extent.render_c()}; "
                          f"{e.var.name}++) {{")
        value = self.emit_block(e.body)
        self.lines.append(f"{self.indent}    {acc} = {prim.c.format(acc, value)};{self.stashed(e, value)}")
        self.lines.append(f"{self.indent}}}")
        return acc

    def stashed(self, e: Reduce, value: str) -> str:
        return f" {self.stash[e]} = {value};" if e in self.stash else ""

    def reduce_in_lanes(self, e: Reduce, acc: str) -> str:
        """A split reduction: `lanes` independent partial accumulators (one vector of them), each
        taking every lanes-th step, combined at the end; the remainder runs after. Independent
        chains hide the latency of the combine, which is what bounds a single accumulator. The
        lanes combine by halving (log2 steps of vector ops): a chain over 16 lanes was most of the
        time of int8 quantization's absmax (blocks of 32) in a decode step."""
        prim, n, r, ind = PRIMITIVES[e.op], self.lanes, e.var.name, self.indent
        part, main = self.fresh("lane"), self.fresh("main")
        # a max keeps a plain max per lane and its NaNs aside (3 ops a step where the NaN-propagating
        # max takes 6; a row max is a softmax's first pass), both combined NaN-propagating at the end
        lanes = [part] + [self.fresh("seen")] * (e.op == "max_reduce")
        self.lines += [f"{ind}float {a}[{n}]; for (int l = 0; l < {n}; l++) {a}[l] = {render_float(prim.identity)};"
                       for a in lanes]
        self.lines += [f"{ind}const long long {main} = ({e.extent.render_c()}) / {n} * {n};",
                       f"{ind}for (long long {r}0 = 0; {r}0 < {main}; {r}0 += {n}) {{", f"{ind}    #pragma omp simd",
                       f"{ind}    for (int l = 0; l < {n}; l++) {{", f"{ind}        const long long {r} = {r}0 + l;"]
        inner = self.child("        ")
        value = inner.emit(e.body)
        step = f"{part}[l] = {prim.c.format(f'{part}[l]', value)};"
        if len(lanes) > 1:
            step = f"{part}[l] = {part}[l] > {value} ? {part}[l] : {value}; " \
                   f"{lanes[1]}[l] = {value} != {value} ? {value} : {lanes[1]}[l];"
        self.lines += inner.lines + [f"{ind}        {step}{self.stashed(e, value)}", f"{ind}    }}"] + \
            self.prefetches(e, n) + [f"{ind}}}"] + \
            [f"{ind}for (int w = {n}; w > 1; w -= w / 2) for (int l = 0; l < w / 2; l++) {a}[l] = "
             f"{prim.c.format(f'{a}[l]', f'{a}[l + w - w / 2]')}; {acc} = {prim.c.format(acc, f'{a}[0]')};" for a in lanes] + \
            [f"{ind}for (long long {r} = {main}; {r} < {e.extent.render_c()}; {r}++) {{"]
        value = self.emit_block(e.body)
        self.lines += [f"{ind}    {acc} = {prim.c.format(acc, value)};{self.stashed(e, value)}", f"{ind}}}"]
        return acc

    def prefetches(self, e: Reduce, n: int) -> list[str]:
        """Prefetch the next row's part of each unit-stride operand of this block of `n` steps. A
        row pass is compute-bound (a softmax's exponentials) and the next row's first pass would
        otherwise wait on memory: the hardware prefetcher stops at page boundaries, a 4096-float
        row spans four pages. (Prefetches never fault, so the last row's may point past the end.)"""
        row, r = self.next_row, e.var.name
        ahead = dict.fromkeys(f"b{ld.buffer}[{ld.index.substitute({row.name: row + 1}).render_c()}]" for ld in loads(e.body)
                              if row is not None and stride(ld.index, e.var) == 1 and row.name in ld.index.vars())
        return [f"{self.indent}    for (int l = 0; l < {n}; l += 16) {{ const long long {r} = {r}0 + l; "
                f"__builtin_prefetch(&{at}); }}" for at in ahead]

    def child(self, indent: str) -> _Emitter:
        """An emitter for a block nested `indent` deeper, seeing the names of this one (merge back
        its lines after use)."""
        return _Emitter(self.program, self.indent + indent, lanes=self.lanes, names=self.names, count=self.count)

    def sum_in_vector(self, groups: list, outer: Reduce | None = None, acc: str | None = None) -> str:
        """Sums over L elements added up (a split reduction: a quantized block's halves), and with
        `outer` summed over blocks, as one `omp simd` loop of L lanes (inside the loop over blocks),
        each lane keeping its own partial sum: no horizontal sum per block. `groups`: (scale, leaves),
        the leaves of a group added, then multiplied by its scale, a C expression (block_dot's float
        dots; None: not scaled), into `acc` if given (declared before). Integer loads of the
        lane loop are staged into an integer array first: a byte in the loop makes gcc pick 16-byte
        vectors for all of it. The array is of int with AVX-512; with AVX2 int staging made gcc
        build each 32-byte vector from two 16-byte stack stores (a store-forwarding stall per
        block: a Q4_1 576x1536 matvec took 580 us, 135 us with short, on one Zen core)."""
        leaves = [leaf for _, group in groups for leaf in group]
        size, i, ind = leaves[0].extent.value, leaves[0].var.name, self.indent
        vec, declare, acc = self.fresh("vec"), acc is None, acc or self.fresh("acc")
        self.lines += [f"{ind}float {f'{acc} = 0.0f, ' * declare}{vec}[{size}] = {{0}};"] + (self.rows_ahead(outer) if outer and declare else [])
        if outer is not None:
            self.lines.append(f"{ind}for (long long {outer.var.name} = 0; {outer.var.name} < {outer.extent.render_c()}; "
                              f"{outer.var.name}++) {{")
        body = self.child("    " if outer is not None else "")
        for leaf in leaves:
            body.hoist(leaf.body, i)
        staged = {}
        for ld in dict.fromkeys(ld for leaf in leaves for ld in loads(leaf.body)):
            dtype = self.program.buffers[ld.buffer].dtype
            if dtype in INT_RANGES and ld.valid == sym(1) and i in ld.index.vars():
                name, buf = body.fresh("stage"), f"b{self.program.buffers[ld.buffer].id}"
                body.lines.append(f"{body.indent}{'int' if cc.VECTOR_LANES == 16 else 'short'} {name}[{size}] __attribute__((aligned(64)));")
                if cc.VECTOR_LANES == 16 and size % 16 == 0 and stride(ld.index, leaves[0].var) == 1:
                    # 16 bytes widened in one register per 16 ints: gcc's own loop stored halves of
                    # 32 bytes and the lane loop read them as one 64-byte vector, which Intel cores do
                    # not forward from the store buffer (a Q8_0 matvec ran at a third of its speed)
                    body.lines += [f"{body.indent}_mm512_store_si512(&{name}[{h}], _mm512_cvtep{dtype[0]}8_epi32(_mm_loadu_si128("
                                   f"(const void *)&{buf}[{ld.index.substitute({i: sym(h)}).render_c()}])));" for h in range(0, size, 16)]
                else:
                    body.lines.append(f"{body.indent}for (long long {i} = 0; {i} < {size}; {i}++) {name}[{i}] = {buf}[{ld.index.render_c()}];")
                staged[ld] = Fixed(f"{name}[{i}]", 0, *INT_RANGES[dtype])
        body.lines += [f"{body.indent}#pragma omp simd", f"{body.indent}for (long long {i} = 0; {i} < {size}; {i}++) {{"]
        inner = body.child("    ")
        for ld, form in staged.items():
            inner.names[("fixed", ld)], inner.names[ld] = form, f"(float){form.code}"
        sums = [(scale, " + ".join(inner.emit(leaf.body) for leaf in group)) for scale, group in groups]
        total = " + ".join(f"{scale} * ({values})" if scale else values for scale, values in sums)
        body.lines += inner.lines + [f"{inner.indent}{vec}[{i}] += {total};", f"{body.indent}}}"]
        self.lines += body.lines + ([f"{ind}}}"] if outer is not None else [])
        self.lines += [f"{ind}#pragma omp simd reduction(+:{acc})",  # a tree of vector adds, not a chain
                       f"{ind}for (int l = 0; l < {size}; l++) {acc} += {vec}[l];"]
        return acc

    def block_dot(self, e: Reduce, terms: list) -> str:
        """Sum over blocks of terms scale * (sum of int8 products over 16 or 32 elements), or of float
        products over 8 to 64 (quant.block_linear: each block's lanes scaled once, sum_in_vector). First a
        vector pass over the row's blocks puts each scale into an array (their float16 loads
        converted 16 at a time) and sums the terms that are no dot (a Q4_1 block's minimum times
        sum(x)); then the dots, with AVX-512 two or four blocks per 64-byte lm_dot32s (each block's
        sums in its lanes, times its scale spread over them), the rest one per lm_dot16x2. Per
        block one at a time, the scalar scale arithmetic and the 16-byte ops were the bound: the
        grouped form ran a Q4_1 576x1536 int8 matvec 2.3x as fast (one Sapphire Rapids core)."""
        ind, r, extent, acc = self.indent, e.var.name, e.extent.render_c(), self.fresh("acc")
        scales = {k: self.fresh("scale") for k, (_, dot) in enumerate(terms) if dot is not None}
        self.lines += self.rows_ahead(e) + [f"{ind}float {acc} = 0.0f{''.join(f', {s}[{extent}]' for s in scales.values())};"]
        pre = self.child("    ")
        pre.names.update(self.halves_staged([scale for scale, _ in terms], e))
        for k, (scale, _) in enumerate(terms):
            value = pre.emit(scale)
            pre.lines.append(f"{pre.indent}{scales[k]}[{r}] = {value};" if k in scales else f"{pre.indent}{acc} += {value};")
        self.lines += [f"{ind}#pragma omp simd reduction(+:{acc})", f"{ind}for (long long {r} = 0; {r} < {extent}; {r}++) {{",
                       *pre.lines, f"{ind}}}"]
        if any(terms[k][1][1] is None for k in scales):  # float dots: each block's lanes scaled once
            return self.sum_in_vector([(f"{scales[k]}[{r}]", terms[k][1][0]) for k in scales], e, acc)
        start = self.grouped_dots(e, terms, scales, acc) if cc.VECTOR_LANES == 16 and e.extent.is_const and e.extent.value >= 4 else 0
        if start == e.extent.value:
            return acc
        lanes, body = self.fresh("dots"), self.child("    ")
        for k, (_, (leaves, pairs, a_signed)) in ((k, terms[k]) for k in scales):
            halves = [[body.bytes16(factor, leaf.var, offset) for factor in pair]
                      for leaf, pair in zip(leaves, pairs) for offset in range(0, leaf.extent.value, 16)]
            (a0, b0), (a1, b1) = halves + [["(lm_b16){0}"] * 2] * (len(halves) == 1)  # (a zero pair: one half)
            body.lines.append(f"{body.indent}{lanes} += lm_dot16x2({a0}, {b0}, {a1}, {b1}, {a_signed}) * {scales[k]}[{r}];")
        self.lines += [f"{ind}lm_v8 {lanes} = {{0}};", f"{ind}for (long long {r} = {start}; {r} < {extent}; {r}++) {{",
                       *body.lines, f"{ind}}}", f"{ind}for (int l = 0; l < 8; l++) {acc} += {lanes}[l];"]
        return acc

    def rows_ahead(self, e: Reduce) -> list[str]:
        """Prefetches of what `e` reads of the output 4 outputs on (a matvec's weight row), a 64-byte
        line each: the stream of a memory-bound matvec otherwise waits on each row (Gemma's 178 MB
        output head: 15 -> 18-20 GB/s on two threads; 4 ahead did best of 2 to 64)."""
        row, lines = self.next_row, []
        for ld in dict.fromkeys(ld for ld in loads(e.body) if row is not None and row.name in ld.index.vars()):
            bound = {v: sym(0) for v in ld.index.vars() - depends_on(e)}  # the reduction's own vars
            span = ld.index.substitute({**bound, e.var.name: e.extent}) - ld.index.substitute(bound)
            lines.append(f"{self.indent}for (long long lm_at = 0; lm_at < {span.render_c()}; lm_at += "
                         f"{64 // STORAGE[self.program.buffers[ld.buffer].dtype].itemsize}) __builtin_prefetch("
                         f"&b{self.program.buffers[ld.buffer].id}[{ld.index.substitute({**bound, row.name: row + 4}).render_c()} + lm_at]);")
        return lines

    def grouped_dots(self, e: Reduce, terms: list, scales: dict, acc: str) -> int:
        """The loop over the first blocks in groups (block_dot's AVX-512 form); returns where the
        rest starts. Two blocks per 64-byte load where every operand's 32 bytes a block lie whole
        and adjacent (Q8_0 against x: no inserts), else four per vector of their 16-byte halves,
        which lie at a constant distance (a Q4_1 block's nibbles against x's halves); 0 when
        neither holds."""
        for size in (2, 4):
            lanes, body, spans = self.fresh("dots"), self.child("    "), range(0, 32 if size == 4 else 1, 16)
            for k in scales:
                leaves, pairs, a_signed = terms[k][1]
                halves = [[body.bytes16(factor, leaf.var, offset, (e.var, size)) for factor in pair]
                          for leaf, pair in zip(leaves, pairs) for offset in spans if offset < leaf.extent.value]
                if None in (code for half in halves for code in half) or size == 2 and leaves[0].extent.value != 32:
                    break
                dots = "_mm512_setzero_si512()"
                for a, b in halves:
                    dots = f"lm_dot32((__m512i){a}, (__m512i){b}, {a_signed}, {dots})"
                body.lines.append(f"{body.indent}{lanes} += (lm_v16)_mm512_cvtepi32_ps({dots}) * lm_spread{size}(&{scales[k]}[{e.var.name}]);")
            else:
                groups = e.extent.value // size * size
                self.lines += [f"{self.indent}lm_v16 {lanes} = {{0}};",
                               f"{self.indent}for (long long {e.var.name} = 0; {e.var.name} < {groups}; {e.var.name} += {size}) {{", *body.lines,
                               f"{self.indent}}}", f"{self.indent}{acc} += _mm512_reduce_add_ps((__m512){lanes});"]
                return groups
        return 0

    def halves_staged(self, exprs: list, e: Reduce) -> dict:
        """{load: its element of a float array} for the float16 loads of `exprs` at a constant
        stride s along e's blocks: the s * (blocks - 1) + 1 halves from the first block's on are
        converted into the array before the loop, 16 at a time (gcc vectorizes no half to float
        conversion itself)."""
        r, staged = e.var.name, {}
        for ld, step in {ld: stride(ld.index, e.var) for x in exprs for ld in loads(x)}.items():
            if self.program.buffers[ld.buffer].dtype == "float16" and ld.valid == sym(1) and step and 0 < step <= 16:
                name, n = self.fresh("halves"), f"({step} * ({e.extent.render_c()} - 1) + 1)"
                first = f"b{self.program.buffers[ld.buffer].id}[{ld.index.substitute({r: sym(0)}).render_c()}]"
                self.lines += [f"{self.indent}float {name}[({n} + 15) / 16 * 16];",
                               f"{self.indent}for (long long j = 0; j < {n}; j += 16) lm_f16x16(&{name}[j], &{first} + j, {n} - j);"]
                staged[ld] = f"{name}[{step} * {r}]"
        return staged

    def bytes16(self, operand, var: Var, offset: int, group: tuple | None = None) -> str | None:
        """16 lanes (`var` = offset, offset + 1, ...) of `operand`, an integer computed from one byte
        load at unit stride along `var`, as an lm_b16 vector: the 16 bytes loaded, then the integer
        ops that unpack them on all lanes in 8-bit arithmetic. With `group` (the block Var, 2 or 4)
        an lm_b64 of the current block and the next: the 64 bytes from here where blocks lie 32
        bytes apart (2), or these 16 of each of 4 blocks, at a constant distance (4). None for
        another operand."""
        found = set(loads(operand))
        load = found.pop() if len(found) == 1 else None
        step = stride(load.index, group[0]) if load and group else None  # (bytes from one block to the next)
        if load is None or not _fixed(load, self) or stride(load.index, var) != 1 or \
                group and (step is None or group[1] == 2 and step != 32):
            return None
        vector = self.child("")
        vector.int_type, name = "lm_b64" if group else "lm_b16", vector.fresh("bytes")
        at = f"&b{self.program.buffers[load.buffer].id}[{load.index.substitute({var.name: sym(offset)}).render_c()}]"
        read = f"lm_bytes16x4({at}, {16 if group[1] == 2 else step})" if group else f"lm_bytes16({at})"
        vector.lines.append(f"{vector.indent}const {vector.int_type} {name} = {read};")
        vector.names[("fixed", load)] = _fixed(load, self)._replace(code=name)
        value = vector.fixed(operand)
        self.lines += vector.lines if value else []
        return value.code if value else None

    def gather(self, e: Gather) -> str:
        """The body evaluated once, at the integer the index holds (0.0 when it is not a valid index)."""
        out, index = self.fresh("gather"), self.emit(e.index)
        self.lines.append(f"{self.indent}float {out} = 0.0f;")
        self.lines.append(f"{self.indent}if ({index} >= 0.0f && {index} < (float)({e.extent.render_c()}) && "
                          f"{index} == (float)(long long){index}) {{")
        self.lines.append(f"{self.indent}    const long long {e.var.name} = (long long){index};")
        value = self.emit_block(e.body)
        self.lines += [f"{self.indent}    {out} = {value};", f"{self.indent}}}"]
        return out


INT_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}  # loads of these dtypes are exact integers
_READS = {"float32": "{}", "float16": "lm_f16({})", "bfloat16": "lm_bf16({})"}  # a load as a float (else a cast)
_EXACT = 1 << 24  # integers below this in magnitude are exact float32 values


def _const(e) -> float | None:
    """The value of an IR expression without loads or loop variables, else None."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, IndexValue) and e.expr.is_const:
        return float(e.expr.value)
    if isinstance(e, Apply):
        args = [_const(a) for a in e.args]
        return None if None in args else float(PRIMITIVES[e.op].reference(*map(np.float32, args)))
    return None


def _log2(c: float | None) -> int | None:
    """m when c == 2^m exactly, else None."""
    if c is None or not 0 < c < float("inf"):
        return None
    mantissa, exponent = np.frexp(c)
    return int(exponent) - 1 if mantissa == 0.5 else None


class Fixed(NamedTuple):
    """A value that is exactly the C int `code` / 2^k, with the int in [lo, hi]; `minus_zero`: the
    float spelling may give -0.0 for it (fmod keeps a dividend's sign, so fmod rules refuse those)."""
    code: str
    k: int
    lo: int
    hi: int
    minus_zero: bool = False


def _fixed(e, em: _Emitter) -> Fixed | None:
    """The rules of _Emitter.fixed, before naming."""
    if isinstance(e, Load):
        buf = em.program.buffers[e.buffer]
        if buf.dtype not in INT_RANGES or e.valid != sym(1):
            return None
        lo, hi = (-127, 127) if buf.kind == "temp" else INT_RANGES[buf.dtype]  # (an int8 temp is int8_valued)
        return Fixed(f"(int)b{buf.id}[{e.index.render_c()}]", 0, lo, hi)
    if not isinstance(e, Apply) or e.op not in ("mul", "add", "mod"):
        return None
    if e.op == "mod":  # x fmod 2^m, x = n / 2^k >= 0: n's low m + k bits
        m, x = _log2(_const(e.args[1])), em.fixed(e.args[0])
        if m is None or not x or x.lo < 0 or x.minus_zero or not 0 <= m + x.k < 31:
            return None
        mask = (1 << (m + x.k)) - 1
        return Fixed(f"({x.code} & {mask})", x.k, 0, min(x.hi, mask))
    if e.op == "mul":  # x * ±2^m
        x, c = (e.args[0], _const(e.args[1])) if _const(e.args[0]) is None else (e.args[1], _const(e.args[0]))
        m, x = _log2(abs(c) if c is not None else None), em.fixed(x)
        if m is None or not x or x.k - m < 0:
            return None
        if c > 0:
            return x._replace(k=x.k - m)
        return Fixed(f"(-{x.code})", x.k - m, -x.hi, -x.lo, x.lo <= 0 <= x.hi)
    floor = _floor_of(e)  # x - fmod(x, 2^m), spelled x + fmod(x, 2^m) * -1: n with its low bits cleared
    if floor is not None:
        x, m = em.fixed(floor[0]), floor[1]
        if x and x.lo >= 0 and not x.minus_zero and 0 <= m + x.k < 31:  # (an integer: k = 0)
            return Fixed(f"(({x.code} >> {x.k}) & ~{(1 << m) - 1})", 0, 0, x.hi >> x.k)
    a, b = em.fixed(e.args[0]), em.fixed(e.args[1])
    if not a or not b or a.k != b.k:
        return None
    return Fixed(f"({a.code} + {b.code})", a.k, a.lo + b.lo, a.hi + b.hi, a.minus_zero and b.minus_zero)


def _floor_of(e: Apply):
    """(x, m) when e is x + fmod(x, 2^m) * -1, else None."""
    for x, neg in (e.args, e.args[::-1]):
        if isinstance(neg, Apply) and neg.op == "mul" and -1.0 in (_const(neg.args[0]), _const(neg.args[1])):
            mod = neg.args[0] if _const(neg.args[1]) == -1.0 else neg.args[1]
            if isinstance(mod, Apply) and mod.op == "mod" and mod.args[0] == x and _log2(_const(mod.args[1])) is not None:
                return x, _log2(_const(mod.args[1]))
    return None


def _summands(e) -> list:
    """The parts of a sum spelled as nested adds (an unrolled sum_reduce of two is an Apply)."""
    if isinstance(e, Apply) and e.op in ("add", "sum_reduce"):
        return [part for arg in e.args for part in _summands(arg)]
    return [e]


def _vector_leaves(body) -> list | None:
    """The sum reductions `body` adds up when all run over one variable with one constant extent
    of 8..64 and hold no reduction or gather themselves (what _Emitter.sum_in_vector renders), else None."""
    leaves = _summands(body)
    if all(isinstance(x, Reduce) and x.op == "sum_reduce" and x.var.name == leaves[0].var.name and x.extent.is_const
           and x.extent == leaves[0].extent and not any(isinstance(n, (Reduce, Gather)) for n in walk(x.body))
           for x in leaves) and 8 <= leaves[0].extent.value <= 64:
        return leaves
    return None


def _block_dot(e: Reduce, em: _Emitter) -> list[tuple[object, tuple | None]] | None:
    """[(scale, dot)] when `e` sums over blocks a sum of terms `scale * dot`, dot (leaves, ordered
    factor pairs, a_signed) per _integer_dot, (leaves, None, None) for a float dot (a sum of float
    products: quant.block_linear), or None for a term that is no dot (at least one is): what
    _Emitter.block_dot renders; else None."""
    found, scratch = [], em.child("")  # (the checks' named values are dropped)
    for term in _summands(e.body):
        found.append((term, None))  # (a term that is no dot: a Q4_1 block's minimum times sum(q))
        for dot, scale in ((term.args, term.args[::-1]) if isinstance(term, Apply) and term.op == "mul" else ()):
            if leaves := _vector_leaves(dot):  # (an integer dot's factor pairs and a_signed; None, None for a float dot)
                found[-1] = (scale, (leaves, *(_integer_dot(leaves, scratch) or (None, None))))
                break
    rest, dots = [term for term, dot in found if dot is None], [dot for _, dot in found if dot is not None]
    one_loop = len(dots) == 1 or all(pairs is not None for _, pairs, _ in dots)  # (float dots share one lane loop)
    return found if dots and one_loop and not any(isinstance(n, (Reduce, Gather)) for t in rest for n in walk(t)) else None


def _integer_dot(leaves: list, em: _Emitter) -> tuple[list, int] | None:
    """(factor pairs in lm_dot16x2's order, a_signed) when `leaves` are 1 or 2 sums of 16 (or one of
    32) products of two int8-ranged integers (_dot_operands) that bytes16 renders, in one maddubs
    form; else None."""
    forms = [_dot_operands(x.body.args, em) if isinstance(x.body, Apply) and x.body.op == "mul" else None for x in leaves]
    if (len(leaves), leaves[0].extent.value) not in ((1, 16), (2, 16), (1, 32)) or None in forms \
            or len({signed for _, signed in forms}) != 1 or not all(em.bytes16(factor, x.var, 0) for x, (pair, _) in zip(leaves, forms) for factor in pair):
        return None
    return [pair for pair, _ in forms], forms[0][1]


def _dot_operands(pair, em: _Emitter) -> tuple[list, int] | None:
    """The two factors of an integer block dot in lm_dot16x2's order, and whether the first may be
    negative (1) -- when both are Fixed integers (k = 0) in [-128, 127] and maddubs computes their
    product exactly: the first is >= 0, or the second is > -128. Else None."""
    ranges = [em.fixed(a) for a in pair]
    if not all(f and f.k == 0 and -128 <= f.lo <= f.hi <= 127 for f in ranges):
        return None
    # first a factor that is never negative, else one that may be -128
    (a, fa), (b, fb) = sorted(zip(pair, ranges), key=lambda factor: (factor[1].lo < 0, factor[1].lo > -128))
    return ([a, b], int(fa.lo < 0)) if fa.lo >= 0 or fb.lo > -128 else None


def _power_of_two_mod(e: Apply, emitter: _Emitter) -> str | None:
    """fmod by a power of two b >= 1 as a - trunc(a / b) * b: exact (dividing by 2^k cannot round
    or overflow, and the remainder is representable) and vectorizable, where fmodf is a library
    call per element. This is how quantized weights unpack their nibbles."""
    m = _log2(abs(e.args[1].value)) if e.op == "mod" and isinstance(e.args[1], Const) else None
    if m is None or m < 0:
        return None
    a, b = emitter.emit(e.args[0]), 2.0 ** m
    return f"({a} - truncf({a} * {render_float(1.0 / b)}) * {render_float(b)})"


def render_kernel(program: KernelProgram, kernel: Kernel, schedule: Schedule | None = None) -> str:
    """One C function computing `kernel` over its whole output, as `schedule` says (default: the rules')."""
    schedule = schedule or default_schedule(kernel)
    lines = [f"static void {kernel.name}(void **restrict bufs, const long long *restrict dims) {{"]
    lines += _arguments(program, kernel, kernel.out)
    plan = plan_tiles(kernel) if isinstance(schedule, Tiled) else None
    if isinstance(schedule, Online):
        lines += render_online(program, kernel, online_plan(kernel), schedule.rows, schedule.keys)
    elif plan is None:
        lines += render_loops(program, kernel, schedule if isinstance(schedule, Loops) else default_loops(kernel))
    elif schedule.min_rows and plan.i is not None and not kernel.shape[-2].is_const:
        lines.append(f"    if (({kernel.shape[-2].render_c()}) < {schedule.min_rows}) {{")
        lines += _loops_with_rows(program, kernel, plan) if schedule.pack_rows else \
            render_loops(program, kernel, default_loops(kernel))
        lines += ["    } else {"] + render_tiled(program, kernel, plan, schedule) + ["    }"]
    else:
        lines += render_tiled(program, kernel, plan, schedule)
    return "\n".join(lines + ["}"])


def _arguments(program: KernelProgram, kernel: Kernel, out: int | None) -> list[str]:
    """C declarations of the dims and of the buffers the kernel reads (and writes: `out`), taken
    from a kernel function's arguments."""
    lines = [f"    const long long {Var(d).render_c()} = dims[{i}]; (void){Var(d).render_c()};" for i, d in enumerate(program.dims)]
    for b in sorted({load.buffer for load in loads(kernel.value)} | ({out} - {None})):
        ctype, const = C_TYPES[program.buffers[b].dtype], "" if b == out else "const "
        lines.append(f"    {const}{ctype} *restrict b{b} = ({const}{ctype} *)bufs[{b}];")
    return lines


def render_loops(program: KernelProgram, kernel: Kernel, schedule: Loops) -> list[str]:
    """The plain schedule: a loop per output dim (outer ones threaded), reductions innermost;
    row values (see `row_values`) hoisted above the innermost loop."""
    lines, loop_vars, rank = [], kernel.loop_vars, len(kernel.shape)
    value = split_reductions(kernel.value)
    hoisted = row_values(kernel)
    parallel = min(schedule.parallel, rank - 1) if hoisted else schedule.parallel
    if kernel.shape and parallel:  # (threaded where there is work enough and more than one thread's share:
        # a decode step's norm is one row, and a region with one iteration is a fork and join for nothing)
        work, shares = numel(kernel.shape) * reduce_work(kernel.value), numel(kernel.shape[:min(parallel, rank)])
        lines.append(f"    #pragma omp parallel for collapse({min(parallel, rank)}) "
                     f"schedule(static) if(({work.render_c()}) >= {PARALLEL_MIN_WORK} && ({shares.render_c()}) > 1)")
    loops = []
    for k, (var, extent) in enumerate(zip(loop_vars, kernel.shape)):
        if schedule.simd and k == rank - 1 and k >= parallel or hoisted and k == rank - 1:
            loops.append("#pragma omp simd")
        loops.append(f"for (long long {var.name} = 0; {var.name} < {extent.render_c()}; {var.name}++)")
    emitter = _Emitter(program, "        ", threaded_reduce=not kernel.shape and parallel > 0, lanes=schedule.lanes)
    store = f"b{kernel.out}[{flat_index(loop_vars, kernel.shape).render_c()}]"
    if not hoisted:
        emitter.next_row = loop_vars[-1] if rank else None
        result = emitter.emit(value)
        return lines + [f"    {line}" for line in loops] + ["    {"] + emitter.lines + [f"        {store} = {result};", "    }"]
    inner, reread = loop_vars[-1], {}
    row_at = lambda var: f"b{kernel.out}[{flat_index(loop_vars[:-1] + [var], kernel.shape).render_c()}]"  # noqa: E731
    for red in (n for n in walk(value) if isinstance(n, Reduce) and n.op == "sum_reduce"):
        # a row sum of values the output uses again (a softmax's exponentials): the sum's loop
        # stores them into the output row, which the output loop then reads instead of recomputing
        element = substitute(red.body, {red.var.name: inner})
        if red.extent == kernel.shape[-1] and inner.name not in depends_on(red) and element != value and \
                any(n == element for n in walk(value)) and any(isinstance(n, Apply) and n.op in TRANSCENDENTAL
                                                               for n in walk(element)):
            emitter.stash[red], reread[element] = row_at(red.var), row_at(inner)
    emitter.next_row = loop_vars[-2] if rank > 1 else None
    emitter.hoist(value, inner.name)  # the row values, once per row
    body = emitter.child("    ")
    body.names.update(reread)
    result = body.emit(value)
    return lines + [f"    {line}" for line in loops[:-2]] + ["    {"] + emitter.lines + \
        [f"        {line}" for line in loops[-2:]] + ["        {"] + body.lines + \
        [f"            {store} = {result};", "        }", "    }"]


def _loops_with_rows(program: KernelProgram, kernel: Kernel, plan) -> list[str]:
    """The plain schedule with the row operands (a normalized input) computed once into a buffer
    first, as the tiled schedule's pack_rows does, and read back by loads: a matrix-vector product
    would recompute them for every output."""
    red, i = plan.reduce, plan.i
    batch = list(zip(kernel.loop_vars[:-2], kernel.shape))
    lines, _ = _precompute(program, plan.rows, batch, i, kernel.shape[-2], red, "rowbuf")
    where = flat_index([v for v, _ in batch] + [i], [x for _, x in batch] + [kernel.shape[-2]])
    rows = Buffer(len(program.buffers), sym(1), "float32", "temp", "rows")
    loads_of = {node: Load(rows.id, (where * len(plan.rows) + q) * red.extent + red.var, sym(1))
                for q, node in enumerate(plan.rows)}
    view = dataclasses.replace(program, buffers=[*program.buffers, rows])
    kernel = dataclasses.replace(kernel, value=_replace_nodes(kernel.value, loads_of))
    return lines + [f"    const float *restrict b{rows.id} = rowbuf;", "    {"] + \
        render_loops(view, kernel, default_loops(kernel)) + ["    }", "    free(rowbuf);"]


def _replace_nodes(e, mapping: dict):
    """`e` with the subtrees in `mapping` replaced."""
    return mapping[e] if e in mapping else rebuild(e, lambda child: _replace_nodes(child, mapping))


def render_oracle(program: KernelProgram, kernel: Kernel) -> str:
    """`lm_oracle(bufs, dims, which, count, out)`: the kernel's value at `count` flat output
    positions `which`, each computed on its own by the plain loop body (no tiling, no threads) --
    the semantics search candidates are checked against, affordable for any output size."""
    lines = ["void lm_oracle(void **restrict bufs, const long long *restrict dims, const long long *restrict which, "
             "long long count, float *restrict out) {"] + _arguments(program, kernel, None)
    # (lm_ names: a symbolic dim may be called n or flat)
    lines += ["    for (long long lm_n = 0; lm_n < count; lm_n++) {", "        long long lm_flat = which[lm_n]; (void)lm_flat;"]
    for var, extent in reversed(list(zip(kernel.loop_vars, kernel.shape))):
        lines.append(f"        const long long {var.name} = lm_flat % ({extent.render_c()}); lm_flat /= ({extent.render_c()});")
    emitter = _Emitter(program, "        ")
    value = emitter.emit(split_reductions(kernel.value))
    return "\n".join(lines + emitter.lines + [f"        out[lm_n] = {value};", "    }", "}"])


# -- the tiled reduction schedule ----------------------------------------------------------------


def render_tiled(program: KernelProgram, kernel: Kernel, plan: TilePlan, s: Tiled) -> list[str]:
    """Loops: batch dims, then the block loops of `s.order` (the capitals threaded, collapsed with
    the batch dims), panels packed at "p"; inside, tiles of ti rows step through the row block,
    each accumulating ti x tj outputs over the whole reduction, then the kernel's epilogue
    (whatever follows the reduction)."""
    red, i, j = plan.reduce, plan.i, plan.j
    ti, tj = (s.ti if i is not None else 1), s.tj
    mc = max(s.mc // ti, 1) * ti
    rows_n, cols_n, k_n = (kernel.shape[-2] if i is not None else sym(1)), kernel.shape[-1], red.extent
    r, K, M, N = red.var.name, red.extent.render_c(), rows_n.render_c(), cols_n.render_c()
    prim = PRIMITIVES[red.op]
    batch = list(zip(kernel.loop_vars[:-2 if i is not None else -1], kernel.shape))
    vec = vector_body(plan) if s.vector and tj % 16 == 0 else None
    npan = len(plan.panels)
    threaded = [b for b in s.blocks if b.threaded]  # (a prefix: Tiled checks; packs_in_order, the pack's place)
    header = {"j": f"for (long long j0 = 0; j0 < {N}; j0 += {tj})", "i": f"for (long long ic = 0; ic < {M}; ic += {mc})"}

    def clamp(var, base, offset, extent, tile):
        if extent.is_const and extent.value % tile == 0:
            return f"const long long {var.name} = {base} + {offset};"
        return (f"const long long {var.name} = {base} + {offset} < {extent.render_c()} ? {base} + {offset} : "
                f"{extent.render_c()} - 1;")

    work, threads = numel(kernel.shape) * k_n, len(batch) + len(threaded)
    out, row_names, panel_names = [], {}, {}
    if s.pack_rows and plan.rows and i is not None:
        out, row_names = _precompute(program, plan.rows, batch, i, rows_n, red, "rowbuf")
    size = numel([x for _, x in batch] + [cols_n]) * k_n * npan
    if windowed(plan) and size.is_const and size.value <= PRECOMPUTED:
        lines, panel_names = _precompute(program, plan.panels, batch, j, cols_n, red, "panbuf")
        out += lines
    # one thread when no loop is threaded: every thread would otherwise run the whole nest
    when = f"({work.render_c()}) >= {PARALLEL_MIN_WORK}" if threads else "0"
    out += [f"    #pragma omp parallel if({when})", "    {"]
    if npan:  # 64-byte aligned: the vector micro-kernel loads whole rows of the panel
        out.append(f"    float *restrict pan = (float *)aligned_alloc(64, (sizeof(float) * (size_t)({K}) * "
                   f"{tj * npan} + 63) / 64 * 64);")
    depth = 0
    if threads:
        out.append(f"    #pragma omp for collapse({threads}) schedule(static)")
    for var, extent in batch:
        out.append(f"    for (long long {var.name} = 0; {var.name} < {extent.render_c()}; {var.name}++)")
    for block in s.blocks:
        if block.loop == "p":
            if npan:
                out += _pack(program, plan, r, K, tj, clamp(j, "j0", "jj", cols_n, tj), panel_names)
            continue
        out.append("    " + header[block.loop] + " {")
        depth += 1
    out.append(f"      for (long long i0 = ic; i0 < ic + {mc} && i0 < {M}; i0 += {ti}) {{")
    pan_at = {node: f"pan[({p} * {K} + {r}) * {tj} + jj]" for p, node in enumerate(plan.panels)}
    row_clamp = clamp(i, "i0", "ii", rows_n, ti) if i is not None else ""
    if vec:
        out += _vector_tile(program, plan, vec, ti, tj, r, K, row_clamp, row_names)
    else:
        out += _generic_tile(program, plan, prim, ti, tj, r, K, pan_at, row_clamp,
                             clamp(j, "j0", "jj", cols_n, tj), row_names)
    out += _store_tile(program, kernel, plan, ti, tj)
    out.append("      }")
    out += ["    }"] * depth
    out += ["    free(pan);"] * bool(npan) + ["    }"]
    return out + ["    free(rowbuf);"] * bool(row_names) + ["    free(panbuf);"] * bool(panel_names)


def _precompute(program, nodes, batch, var, extent, red, name) -> tuple[list[str], dict]:
    """Before the tiles, in parallel: each of `nodes` (the row operands, or the window panels) at
    every (batch, `var`, reduction step) into buffer `name`, read back by the tiles; the C
    expression of each node there. An index divided by constants (a convolution's window: row //
    56, r % 3) loops over its digits instead (kernels.digits), so the window's index math is
    affine, not a division per element."""
    K, r = red.extent.render_c(), red.var.name
    count, where = len(nodes), flat_index([v for v, _ in batch] + [var], [x for _, x in batch] + [extent])
    total = numel([x for _, x in batch] + [extent])
    at = lambda q: f"{name}[(({where.render_c()}) * {count} + {q}) * {K} + {r}]"  # noqa: E731
    exprs = [x for node in nodes for x in _ir_exprs(node)]
    loops, named = [], {}
    for v, n in ((var, extent), (red.var, red.extent)):
        split = digits(v.name, n.value, exprs) if n.is_const else None
        parts = split[0][::-1] if split else [v]  # outermost digit first
        loops.append([(d, sym(d.bounds()[1] + 1) if split else n) for d in parts])
        if split:
            named[v.name] = split[1]
    out = [f"    float *restrict {name} = (float *)malloc(sizeof(float) * (size_t)({total.render_c()}) * {count} * "
           f"{K});",
           f"    #pragma omp parallel for collapse({len(batch) + len(loops[0])}) schedule(static) "
           f"if((({total.render_c()}) * {K}) >= {PARALLEL_MIN_WORK})"]
    out += [f"    for (long long {v.name} = 0; {v.name} < {x.render_c()}; {v.name}++)" for v, x in batch + loops[0]]
    out += [f"      for (long long {v.name} = 0; {v.name} < {x.render_c()}; {v.name}++)" for v, x in loops[1]]
    out += ["      {"] + [f"        const long long {n} = {index.render_c()};" for n, index in named.items()]
    em = _Emitter(program, "        ")
    for q, node in enumerate(nodes):
        em.lines.append(f"        {at(q)} = {em.emit(substitute(node, named))};")
    return out + em.lines + ["      }"], {node: at(q) for q, node in enumerate(nodes)}


def _pack(program, plan, r, K, tj, j_clamp, panel_names) -> list[str]:
    """Copy (compute) the panel operands of this column block, reduction block into `pan`
    (copy from `panel_names`' buffer where they were computed before the tiles)."""
    out = [f"      for (long long {r} = 0; {r} < {K}; {r}++)", "        #pragma omp simd",
           f"        for (long long jj = 0; jj < {tj}; jj++) {{", f"          {j_clamp}"]
    em = _Emitter(program, "          ", names=panel_names)
    for p, node in enumerate(plan.panels):
        value = em.emit(node)
        em.lines.append(f"          pan[({p} * {K} + {r}) * {tj} + jj] = {value};")
    return out + em.lines + ["        }"]


def _rows(program, plan, ti, row_clamp, indent, row_names) -> tuple[list[str], dict]:
    """Code computing (or, packed, reading) the row values of this reduction step for the tile's ti rows."""
    if not plan.rows:
        return [], {}
    out = [indent + " ".join(f"float row{q}[{ti}];" for q in range(len(plan.rows))),
           f"{indent}#pragma GCC unroll {ti}", f"{indent}for (int ii = 0; ii < {ti}; ii++) {{"]
    if row_clamp:
        out.append(f"{indent}  {row_clamp}")
    em = _Emitter(program, indent + "  ", names=row_names)
    for q, node in enumerate(plan.rows):
        em.lines.append(f"{indent}  row{q}[ii] = {em.emit(node)};")
    return out + em.lines + [f"{indent}}}"], {node: f"row{q}[ii]" for q, node in enumerate(plan.rows)}


def _generic_tile(program, plan, prim, ti, tj, r, K, pan_at, row_clamp, col_clamp, row_names) -> list[str]:
    """The micro-kernel for any body: arrays of accumulators, `omp simd` over the tile's columns."""
    red, i, j = plan.reduce, plan.i, plan.j
    out = [f"        float acc[{ti}][{tj}];",
           f"        for (int ii = 0; ii < {ti}; ii++) for (int jj = 0; jj < {tj}; jj++) "
           f"acc[ii][jj] = {render_float(prim.identity)};",
           f"        for (long long {r} = 0; {r} < {K}; {r}++) {{"]
    row_lines, names = _rows(program, plan, ti, row_clamp, "          ", row_names)
    out += row_lines
    names.update(pan_at)
    out += [f"          #pragma GCC unroll {ti}", f"          for (int ii = 0; ii < {ti}; ii++) {{",
            "            #pragma omp simd", f"            for (int jj = 0; jj < {tj}; jj++) {{"]
    em = _Emitter(program, "              ", names=names)
    inner_deps = frozenset().union(*(x.vars() for x in _ir_exprs(red.body, skip=names)))  # (the rest of the body)
    if i is not None and i.name in inner_deps:
        em.lines.append(f"              {row_clamp}")
    if j.name in inner_deps:
        em.lines.append(f"              {col_clamp}")
    value = em.emit(red.body)
    return out + em.lines + [f"              acc[ii][jj] = {prim.c.format('acc[ii][jj]', value)};",
                             "            }", "          }", "        }", "        float (*tile)[%d] = acc;" % tj]


def _vector_tile(program, plan, vec, ti, tj, r, K, row_clamp, row_names) -> list[str]:
    """The micro-kernel for row x panel products: ti x tj/lanes vector accumulators that stay in
    registers, each step one broadcast row value times tj/lanes panel vectors (fused multiply-adds)."""
    row, _ = vec
    nv = tj // cc.VECTOR_LANES
    out = [f"        lm_vec acc[{ti}][{nv}];",
           f"        #pragma GCC unroll {ti * nv}",
           f"        for (int q = 0; q < {ti * nv}; q++) acc[q / {nv}][q % {nv}] = (lm_vec){{0}};",
           f"        for (long long {r} = 0; {r} < {K}; {r}++) {{",
           f"          const lm_vec *restrict pv = (const lm_vec *)&pan[{r} * {tj}];",
           f"          #pragma GCC unroll {ti}", f"          for (int ii = 0; ii < {ti}; ii++) {{"]
    if row_clamp:
        out.append(f"            {row_clamp}")
    em = _Emitter(program, "            ", names=row_names)
    a = em.emit(row)
    out += em.lines + [f"            #pragma GCC unroll {nv}",
                       f"            for (int v = 0; v < {nv}; v++) acc[ii][v] += {a} * pv[v];", "          }",
                       "        }", f"        float tile[{ti}][{tj}];", "        memcpy(tile, acc, sizeof tile);"]
    return out


def _store_tile(program, kernel, plan, ti, tj) -> list[str]:
    """Write the tile's in-bounds outputs: the epilogue applied to each total. A tile wholly inside
    the output is written by a loop without bounds tests: with them gcc vectorizes the store into
    masked moves, which AMD Zen 3 runs so slowly that SmolLM2's SiLU-gated prefill matmul took 30
    ms instead of 14 (512 x 576 x 1536, one core)."""
    # the tile's output dims: (loop variable, the tile's first index, the step in it, its size, extent)
    point = (([(plan.i, "i0", "ii", ti, kernel.shape[-2])] if plan.i is not None else [])
             + [(plan.j, "j0", "jj", tj, kernel.shape[-1])])
    em = _Emitter(program, "            ")
    em.names[plan.reduce] = "tile[ii][jj]"
    value = em.emit(kernel.value)
    store = ([f"          const long long {var.name} = {first} + {step};" for var, first, step, _, _ in point]
             + em.lines + [f"            b{kernel.out}[{flat_index(kernel.loop_vars, kernel.shape).render_c()}] = {value};"])
    whole = " && ".join(f"{first} + {size} <= {extent.render_c()}" for _, first, _, size, extent in point)
    inside = " && ".join(f"{var.name} < {extent.render_c()}" for var, _, _, _, extent in point)
    loop = f"        for (int ii = 0; ii < {ti}; ii++) for (int jj = 0; jj < {tj}; jj++) {{"
    return ([f"        if ({whole}) {{", loop, *store, "        }", "        } else {", loop, *store[:len(point)],
             f"          if ({inside}) {{", *store[len(point):], "          }", "        }", "        }"])


def render_program(program: KernelProgram, schedules: dict | None = None) -> str:
    """All kernels plus two entry points: lm_run, and lm_run_profiled that also times each kernel.
    `schedules` maps a kernel's name to its schedule, or to a list of them, one per shape bucket:
    a call runs each kernel with the schedule of the bucket its caller names after the dims
    (the one nearest them, search.nearest_bucket); missing: the default rules.

    Kernels equal up to the buffers they touch (canonical_form) share one C function, called with
    their own buffers: a model's repeated layers are compiled once, which keeps the source and
    the C compiler's time (a cold start) small."""
    schedules = schedules or {}
    parts, functions, calls = [PRELUDE], {}, []
    for kernel in program.kernels:
        canon, ids = canonical_form(kernel)
        chosen = schedules.get(kernel.name) or default_schedule(kernel)
        names = []
        for schedule in chosen if isinstance(chosen, list) else [chosen]:
            key = (canon.value, canon.out, canon.shape, schedule, tuple(program.buffers[b].dtype for b in ids))
            if key not in functions:
                functions[key] = f"lm_f{len(functions)}_{kernel.name.split('_', 1)[-1]}"
                view = dataclasses.replace(program, buffers=[dataclasses.replace(program.buffers[b], id=k)
                                                             for k, b in enumerate(ids)])
                parts.append(render_kernel(view, dataclasses.replace(canon, name=functions[key]), schedule))
            names.append(functions[key])
        function = names[0] if len(set(names)) == 1 else \
            "(" + " : ".join([f"lm_bucket == {k} ? {name}" for k, name in enumerate(names[:-1])] + [names[-1]]) + ")"
        args = ", ".join(f"bufs[{b}]" for b in ids)
        calls.append(f"{{ void *args[] = {{{args}}}; {function}(args, dims); }} /* {kernel.name} */")
    timed = "\n".join(f"    t = omp_get_wtime(); {call} seconds[{i}] = omp_get_wtime() - t;"
                      for i, call in enumerate(calls))
    calls = "\n".join(f"    {call}" for call in calls)
    start = f"    const long long lm_bucket = dims[{len(program.dims)}]; (void)lm_bucket;\n"  # (search.nearest_bucket)
    parts.append(f"void lm_run(void **bufs, const long long *dims) {{\n{start}{calls}\n}}\n")
    parts.append(f"void lm_run_profiled(void **bufs, const long long *dims, double *seconds) {{\n"
                 f"    double t; (void)t;\n{start}{timed}\n}}\n")
    return "\n\n".join(parts)


