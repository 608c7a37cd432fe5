"""C for online-softmax kernels (compiler/online.py): flash attention, tiled for the CPU.

Threads take (batch, block of `ti` query rows). For each block of `tj` keys: the block's keys
and values are packed, the ti x tj scores come from a vector micro-kernel (query rows times the
packed keys, then the rest of the score expression: scale, mask), each row's running max, sum
and output accumulators are rescaled and updated, and a second micro-kernel adds the weights
times the packed values. Only ti x tj scores ever exist (on the stack), never S x S.

Two exact skips make a causal mask cost half: when the score is affine in the dot product and
its slope is 0 on a whole block (every position masked), the dot products are not computed;
when every weight of a row in the block is 0 (exp2 underflows), that row's update is skipped.
Both assume finite q, k, v, as PyTorch's causal kernel does (it never reads masked positions).
"""
from __future__ import annotations

from ...compiler.kernels import Apply, Const, Kernel, KernelProgram, depends_on, flat_index, numel, walk
from ...compiler.online import OnlinePlan, accumulated, factors, product, slope
from ...ops import PRIMITIVES



def render_online(program: KernelProgram, kernel: Kernel, plan: OnlinePlan, ti: int, tj: int) -> list[str]:
    """The body of the kernel's C function (see the module doc): blocks of `ti` query rows (a
    multiple of 4) x `tj` keys (a multiple of 16); micro-kernels take 4 rows at a time, then
    single rows (a decode step's one query row costs one row, not four)."""
    from . import cc
    from .render import _Emitter, render_float
    from .schedules import PARALLEL_MIN_WORK
    *batch, i, d = kernel.loop_vars
    j, k = plan.total.var.name, plan.dot.var.name
    M, N = kernel.shape[-2].render_c(), plan.total.extent.render_c()
    D, K = kernel.shape[-1].value, plan.dot.extent.value
    nv, dv, c = tj // cc.VECTOR_LANES, D // cc.VECTOR_LANES, render_float(plan.scale)  # vectors per block row
    vmax = PRIMITIVES["max_reduce"].c  # NaN-propagating, as the max_reduce it replaces

    count = [0]  # C names stay unique across the emitters of one function

    def emit(expr, indent, names=None, declare=""):
        em = _Emitter(program, indent, names=names, count=count)
        value = em.emit(expr)
        return ([indent + declare] if declare else []) + em.lines, value

    work = numel(kernel.shape[:-1]) * plan.total.extent * (D + K)
    out = [f"    #pragma omp parallel for collapse({len(batch) + 1}) schedule(dynamic) "
           f"if(({work.render_c()}) >= {PARALLEL_MIN_WORK})"]
    out += [f"    for (long long {v.name} = 0; {v.name} < {n.render_c()}; {v.name}++)" for v, n in zip(batch, kernel.shape)]
    clamp_i = f"const long long {i.name} = lm_i0 + lm_ii < {M} ? lm_i0 + lm_ii : {M} - 1;"
    clamp_j = f"const long long {j} = lm_j0 + lm_jj < {N} ? lm_j0 + lm_jj : {N} - 1;"
    out += [f"    for (long long lm_i0 = 0; lm_i0 < {M}; lm_i0 += {ti}) {{",
            f"      float lm_qp[{ti}][{K}] __attribute__((aligned(64))), lm_kt[{K}][{tj}] __attribute__((aligned(64)));",
            f"      float lm_vp[{tj}][{D}] __attribute__((aligned(64))), lm_acc[{ti}][{D}] __attribute__((aligned(64)));",
            f"      float lm_s[{ti}][{tj}] __attribute__((aligned(64))), lm_p[{ti}][{tj}] __attribute__((aligned(64)));",
            f"      float lm_m[{ti}], lm_l[{ti}], lm_alpha[{ti}]; int lm_live[{ti}];",
            f"      const int lm_nr = {M} - lm_i0 < {ti} ? (int)({M} - lm_i0) : {ti};  /* rows in use */",
            f"      for (int lm_ii = 0; lm_ii < lm_nr; lm_ii++) {{ lm_m[lm_ii] = -INFINITY; lm_l[lm_ii] = 0.0f; "
            f"for (int lm_dd = 0; lm_dd < {D}; lm_dd++) lm_acc[lm_ii][lm_dd] = 0.0f; }}",
            f"      for (int lm_ii = 0; lm_ii < lm_nr; lm_ii++) {{", f"        {clamp_i}",
            f"        for (long long {k} = 0; {k} < {K}; {k}++) {{"]
    lines, q = emit(plan.query, "          ")
    out += lines + [f"          lm_qp[lm_ii][{k}] = {q};", "        }", "      }",
                    f"      for (long long lm_j0 = 0; lm_j0 < {N}; lm_j0 += {tj}) {{"]
    # -- does this block's score depend on the dot product at all? (the score is affine in it: slope 0?)
    rise = slope(plan.score, plan.dot)
    if rise is not None:
        out += ["        int lm_dotless = 1; float lm_top0 = -INFINITY;", f"        for (int lm_ii = 0; lm_ii < lm_nr && lm_dotless; lm_ii++) {{",
                f"          {clamp_i}", "          #pragma omp simd reduction(&:lm_dotless) reduction(max:lm_top0)",
                f"          for (int lm_jj = 0; lm_jj < {tj}; lm_jj++) {{", f"            {clamp_j}"]
        em = _Emitter(program, "            ", count=count)
        _emit_free(em, plan.score, plan.dot)  # the mask: shared by both evaluations
        inner = em.child("")
        inner.names[plan.dot] = "0.0f"
        at = [inner.emit(plan.score)]  # the score at dot = 0, then its slope
        em.lines += inner.lines
        at.append(em.emit(rise))
        out += em.lines + [f"            lm_dotless &= ({at[1]} == 0.0f);",
                           f"            lm_top0 = lm_j0 + lm_jj < {N} && {at[0]} > lm_top0 ? {at[0]} : lm_top0;", "          }", "        }",
                           # every weight of the block is 0 for rows that have seen a key: nothing changes
                           "        int lm_dead = lm_dotless && lm_top0 == lm_top0;",
                           f"        for (int lm_ii = 0; lm_ii < lm_nr && lm_dead; lm_ii++) "
                           f"lm_dead = lm_m[lm_ii] != -INFINITY && lm_exp2((lm_top0 - lm_m[lm_ii]) * {c}) == 0.0f;",
                           "        if (lm_dead) continue;"]
    else:
        out.append("        const int lm_dotless = 0;")
    # -- pack this block's keys and values; the scores' dot products by a vector micro-kernel
    # (fewer than 4 rows -- a decode step -- take each dot product straight from the keys: packing them
    # transposed would cost more than the one use it serves; and only for keys that exist: the last
    # block's clamped copies of the last key, up to tj - 1 of them, were most of a step's attention)
    out += [f"        for (int lm_jj = 0; lm_jj < {tj}; lm_jj++) {{", f"          {clamp_j}",
            f"          if (!lm_dotless && lm_nr >= 4) for (long long {k} = 0; {k} < {K}; {k}++) {{"]
    lines, key = emit(plan.key, "            ")
    out += lines + [f"            lm_kt[{k}][lm_jj] = {key};", "          }",
                    f"          for (int lm_ii = 0; lm_ii < lm_nr && !lm_dotless && lm_nr < 4 && lm_j0 + lm_jj < {N}; lm_ii++) {{",
                    "            float lm_dot = 0.0f;", "            #pragma omp simd reduction(+:lm_dot)",
                    f"            for (long long {k} = 0; {k} < {K}; {k}++) {{"]
    lines, key = emit(plan.key, "              ")
    out += lines + [f"              lm_dot += lm_qp[lm_ii][{k}] * {key};", "            }",
                    "            lm_s[lm_ii][lm_jj] = lm_dot;", "          }",
                    f"          for (long long {d.name} = 0; {d.name} < {D} && lm_nr >= 4; {d.name}++) {{"]
    lines, value = emit(plan.value, "            ")
    out += lines + [f"            lm_vp[lm_jj][{d.name}] = {value};", "          }", "        }",
                    "        if (!lm_dotless && lm_nr >= 4) {", "        int lm_ii = 0;"]
    for rows, step in ((4, "lm_ii + 4 <= lm_nr; lm_ii += 4"), (1, "lm_ii < lm_nr; lm_ii++")):  # fours, then single rows
        out += [f"        for (; {step}) {{", f"          lm_vec lm_c[{rows}][{nv}];",
                f"          for (int lm_r = 0; lm_r < {rows}; lm_r++) for (int lm_v = 0; lm_v < {nv}; lm_v++) "
                f"lm_c[lm_r][lm_v] = (lm_vec){{0}};",
                f"          for (long long lm_kk = 0; lm_kk < {K}; lm_kk++) {{",
                "            const lm_vec *restrict lm_kv = (const lm_vec *)lm_kt[lm_kk];",
                f"            #pragma GCC unroll {rows}", f"            for (int lm_r = 0; lm_r < {rows}; lm_r++)",
                f"              #pragma GCC unroll {nv}",
                f"              for (int lm_v = 0; lm_v < {nv}; lm_v++) lm_c[lm_r][lm_v] += lm_qp[lm_ii + lm_r][lm_kk] * lm_kv[lm_v];",
                "          }", f"          for (int lm_r = 0; lm_r < {rows}; lm_r++) for (int lm_v = 0; lm_v < {nv}; lm_v++) "
                "((lm_vec *)lm_s[lm_ii + lm_r])[lm_v] = lm_c[lm_r][lm_v];", "        }"]
    out += ["        }"]
    # -- the online update of each row
    out += [f"        for (int lm_ii = 0; lm_ii < lm_nr; lm_ii++) {{", f"          {clamp_i}", "          float lm_top = -INFINITY;",
            "          int lm_nan = 0;", "          #pragma omp simd reduction(max:lm_top) reduction(|:lm_nan)",
            f"          for (int lm_jj = 0; lm_jj < {tj}; lm_jj++) {{", f"            {clamp_j}"]
    lines, a = emit(plan.score, "            ", {plan.dot: "lm_dot"}, "const float lm_dot = lm_dotless ? 0.0f : lm_s[lm_ii][lm_jj];")
    out += lines + [f"            const float lm_a = lm_j0 + lm_jj < {N} ? {a} : -INFINITY;",
                    "            lm_s[lm_ii][lm_jj] = lm_a;", "            lm_top = lm_top > lm_a ? lm_top : lm_a;", "            lm_nan |= lm_a != lm_a;",
                    "          }", "          if (lm_nan) lm_top = NAN;  /* max_reduce propagates NaN */",
                    f"          const float lm_mnew = {vmax.format('lm_m[lm_ii]', 'lm_top')};",
                    "          const float lm_shift = lm_mnew == -INFINITY ? 0.0f : lm_mnew;  /* a row masked so far: weights 0 */",
                    f"          lm_live[lm_ii] = lm_exp2((lm_top - lm_shift) * {c}) != 0.0f || lm_top != lm_top;",
                    f"          lm_alpha[lm_ii] = lm_m[lm_ii] == lm_mnew ? 1.0f : lm_exp2((lm_m[lm_ii] - lm_shift) * {c});",
                    "          lm_m[lm_ii] = lm_mnew;", "          if (!lm_live[lm_ii]) continue;", "          float lm_total = 0.0f;",
                    "          #pragma omp simd reduction(+:lm_total)", f"          for (int lm_jj = 0; lm_jj < {tj}; lm_jj++) {{",
                    f"            lm_p[lm_ii][lm_jj] = lm_exp2((lm_s[lm_ii][lm_jj] - lm_shift) * {c});", "            lm_total += lm_p[lm_ii][lm_jj];",
                    "          }", "          lm_l[lm_ii] = lm_l[lm_ii] * lm_alpha[lm_ii] + lm_total;", "        }",
                    "        if (lm_nr < 4) for (int lm_ii = 0; lm_ii < lm_nr; lm_ii++) {",  # (a decode step: values read where they are)
        "          if (!lm_live[lm_ii]) continue;",
        f"          for (int lm_dd = 0; lm_dd < {D}; lm_dd++) lm_acc[lm_ii][lm_dd] *= lm_alpha[lm_ii];",
        f"          for (int lm_jj = 0; lm_jj < {tj} && lm_j0 + lm_jj < {N}; lm_jj++) {{", f"            {clamp_j}",
        "            const float lm_w = lm_p[lm_ii][lm_jj];",
        "            #pragma omp simd", f"            for (long long {d.name} = 0; {d.name} < {D}; {d.name}++) {{"]
    lines, value = emit(plan.value, "              ")
    out += lines + [f"              lm_acc[lm_ii][{d.name}] += lm_w * {value};", "            }", "          }", "        }",
        "        else {", "        int lm_ii = 0;"]
    # acc = acc * alpha + p @ vp, in chunks of at most 4 vectors of columns: 4 rows x 16 vectors
    # (a head of 256, Gemma's) spilled the accumulators out of the 32 registers
    ch = max(c for c in (1, 2, 3, 4) if dv % c == 0)
    for rows, step in ((4, "lm_ii + 4 <= lm_nr; lm_ii += 4"), (1, "lm_ii < lm_nr; lm_ii++")):
        live = " | ".join(f"lm_live[lm_ii + {r}]" for r in range(rows))
        out += [f"        for (; {step}) {{", f"          if (!({live})) continue;",
                f"          for (int lm_v0 = 0; lm_v0 < {dv}; lm_v0 += {ch}) {{", f"          lm_vec lm_c[{rows}][{ch}];",
                f"          for (int lm_r = 0; lm_r < {rows}; lm_r++) for (int lm_v = 0; lm_v < {ch}; lm_v++) "
                f"lm_c[lm_r][lm_v] = ((lm_vec *)lm_acc[lm_ii + lm_r])[lm_v0 + lm_v] * lm_alpha[lm_ii + lm_r];",
                f"          for (int lm_jj = 0; lm_jj < {tj}; lm_jj++) {{",
                "            const lm_vec *restrict lm_vv = (const lm_vec *)lm_vp[lm_jj] + lm_v0;",
                f"            #pragma GCC unroll {rows}", f"            for (int lm_r = 0; lm_r < {rows}; lm_r++) {{",
                "              const float lm_w = lm_live[lm_ii + lm_r] ? lm_p[lm_ii + lm_r][lm_jj] : 0.0f;",
                f"              #pragma GCC unroll {ch}",
                f"              for (int lm_v = 0; lm_v < {ch}; lm_v++) lm_c[lm_r][lm_v] += lm_w * lm_vv[lm_v];",
                "            }", "          }",
                f"          for (int lm_r = 0; lm_r < {rows}; lm_r++) for (int lm_v = 0; lm_v < {ch}; lm_v++) "
                "((lm_vec *)lm_acc[lm_ii + lm_r])[lm_v0 + lm_v] = lm_c[lm_r][lm_v];", "          }", "        }"]
    out += ["        }", "      }"]
    # -- epilogue: the kernel's value with the sum, its row max and row sum read from the accumulators
    names = accumulated(kernel, plan, j, row_sum="lm_l[lm_ii]", row_max="lm_m[lm_ii]")
    outside = product([Const(1.0)] + [f for f in factors(plan.total.body) if j not in depends_on(f)])
    store = f"b{kernel.out}[{flat_index(kernel.loop_vars, kernel.shape).render_c()}]"
    out += [f"      for (int lm_ii = 0; lm_ii < lm_nr && lm_i0 + lm_ii < {M}; lm_ii++) {{", f"        const long long {i.name} = lm_i0 + lm_ii;",
            f"        for (long long {d.name} = 0; {d.name} < {D}; {d.name}++) {{"]
    em = _Emitter(program, "          ", names=names, count=count)
    em.names[plan.total] = f"({em.emit(outside)} * lm_acc[lm_ii][{d.name}])"
    result = em.emit(kernel.value)
    return out + em.lines + [f"          {store} = {result};", "        }", "      }", "    }"]


def _emit_free(em, e, target) -> None:
    """Emit the subtrees of `e` that do not contain `target` (so later emissions reuse them)."""
    if target not in set(walk(e)):
        em.emit(e)
    elif isinstance(e, Apply):
        for a in e.args:
            _emit_free(em, a, target)
