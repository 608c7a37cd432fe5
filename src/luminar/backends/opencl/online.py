"""The online-softmax (flash) attention form as a GPU kernel (compiler/online.py has the recurrence).

A work-group takes one batch index and a block of `rows` query rows, with `lanes` work-items per
row. Its query rows are staged in local memory once; then, for each block of `keys` keys, the
whole work-group stages the keys and values (their expressions evaluated as they are stored: a
dequantized or rotated operand costs one evaluation per element), each work-item scores every
lanes-th key of its row (the dot product from local memory, then the rest of the score: scale,
mask), and every work-item of a row rescales its running max, sum and accumulators and adds the
block's weights times the values for the output columns it owns (every lanes-th). Only
rows x keys scores exist at any time, in local memory, never S x S.

Each lane keeps the max of its scores and the sum of its weights in local memory; the lanes of
a row combine those of all lanes in the same order, so they agree bit for bit without a
broadcast. A row whose every weight in the block is 0 (exp2 underflows) skips the value update,
and a block masked for every row of the work-group (a causal mask's future keys) is skipped
before its keys are staged. Barriers are outside every branch that could differ between
work-items. (Math is spelled as ops.PRIMITIVES spells it, exp2f: each dialect's prelude maps
those names.)
"""
from __future__ import annotations

from ...compiler.kernels import Apply, Const, Kernel, KernelProgram, depends_on, flat_index, numel
from ...compiler.online import OnlinePlan, accumulated, factors, slope
from ...ops import PRIMITIVES
from .dialect import Dialect
from .schedules import Online


def render_online(program: KernelProgram, kernel: Kernel, plan: OnlinePlan, s: Online, d: Dialect) -> list[str]:
    """The body of the kernel function (see the module doc)."""
    from .render import Emitter, _unflatten, render_float
    *batch, i, col = kernel.loop_vars
    j, k = plan.total.var.name, plan.dot.var.name
    ix = d.index
    M, N = kernel.shape[-2].render_c(), plan.total.extent.render_c()
    D, K = kernel.shape[-1].value, plan.dot.extent.value
    rows, keys, lanes = s.rows, s.keys, s.lanes
    owned = D // lanes  # output columns per work-item
    c = render_float(plan.scale)
    vmax = PRIMITIVES["max_reduce"].c  # NaN-propagating, as the max_reduce it replaces
    count = [0]  # names stay unique across the emitters of one function

    def emit(expr, indent: str, names: dict | None = None) -> tuple[list[str], str]:
        em = Emitter(program, d, indent, names)
        em.count = count
        value = em.emit(expr)
        return em.lines, value

    items = rows * lanes
    lines = [f"    {d.local_array} float lm_q[{rows * K}];", f"    {d.local_array} float lm_k[{keys * K}];",
             f"    {d.local_array} float lm_v[{keys * D}];", f"    {d.local_array} float lm_s[{rows * keys}];",
             f"    {d.local_array} float lm_p[{rows * keys}];",
             f"    {d.local_array} float lm_tops[{rows * lanes}];",  # each lane's max of its scores of the block
             f"    {d.local_array} float lm_sums[{rows * lanes}];",  # and sum of its weights
             f"    {d.local_array} int lm_flag[1];",  # whether the whole block of keys can be skipped
             f"    const int lm_lane = (int){d.local_id.format(0)}, lm_r = (int){d.local_id.format(1)};",
             f"    const int lm_lid = lm_r * {lanes} + lm_lane;",
             f"    const {ix} lm_i0 = ({ix}){d.group_id.format(1)} * {rows};",
             f"    const {ix} lm_batch = ({ix}){d.group_id.format(2)};"]
    if d.dims_in_memory:  # (the launch may round dims up: extra work-groups leave, all their items alike)
        lines.append(f"    if (lm_batch >= {numel(kernel.shape[:-2]).render_c()}) return;")
    lines += _unflatten("lm_batch", batch, kernel.shape[:-2], d)
    # -- the block's query rows, once
    lines += [f"    for (int lm_t = lm_lid; lm_t < {rows * K}; lm_t += {items}) {{",
              f"        const {ix} {i.name} = min(lm_i0 + lm_t / {K}, ({ix})({M}) - 1), {k} = lm_t % {K};"]
    body, q = emit(plan.query, "        ")
    lines += body + [f"        lm_q[lm_t] = {q};", "    }", f"    {d.barrier}"]
    lines += [f"    const {ix} {i.name} = min(lm_i0 + lm_r, ({ix})({M}) - 1);  /* (a row past the end computes, stores nothing) */",
              "    float lm_m = -INFINITY, lm_l = 0.0f;", f"    float lm_acc[{owned}];",
              f"    for (int lm_c = 0; lm_c < {owned}; lm_c++) lm_acc[lm_c] = 0.0f;",
              f"    for ({ix} lm_j0 = 0; lm_j0 < {N}; lm_j0 += {keys}) {{"]
    lines += _skip_dead_blocks(plan, s, d, emit, j, N, c)
    # -- stage the block's keys and values
    # (keys transposed: the work-items of a row score adjacent keys, so they read adjacent words)
    lines += [f"        for (int lm_t = lm_lid; lm_t < {keys * K}; lm_t += {items}) {{",
              f"            const {ix} {j} = min(lm_j0 + lm_t % {keys}, ({ix})({N}) - 1), {k} = lm_t / {keys};"]
    body, key = emit(plan.key, "            ")
    lines += body + [f"            lm_k[lm_t] = {key};", "        }",
                     f"        for (int lm_t = lm_lid; lm_t < {keys * D}; lm_t += {items}) {{",
                     f"            const {ix} {j} = min(lm_j0 + lm_t / {D}, ({ix})({N}) - 1), {col.name} = lm_t % {D};"]
    body, value = emit(plan.value, "            ")
    lines += body + [f"            lm_v[lm_t] = {value};", "        }", f"        {d.barrier}"]
    # -- this work-item's scores: every lanes-th key of its row
    lines += ["        float lm_top = -INFINITY;", "        int lm_nan = 0;",
              f"        for (int lm_jj = lm_lane; lm_jj < {keys}; lm_jj += {lanes}) {{",
              f"            const {ix} {j} = min(lm_j0 + lm_jj, ({ix})({N}) - 1);",
              "            float lm_dot = 0.0f;", "            #pragma unroll",  # (straight-line code PoCL can vectorize across work-items)
              f"            for (int lm_kk = 0; lm_kk < {K}; lm_kk++) lm_dot += lm_q[lm_r * {K} + lm_kk] * lm_k[lm_kk * {keys} + lm_jj];"]
    body, score = emit(plan.score, "            ", {plan.dot: "lm_dot"})
    lines += body + [f"            const float lm_a = lm_j0 + lm_jj < {N} ? {score} : -INFINITY;",
                     f"            lm_s[lm_r * {keys} + lm_jj] = lm_a;",
                     "            lm_top = lm_top > lm_a ? lm_top : lm_a;", "            lm_nan |= lm_a != lm_a;", "        }",
                     f"        lm_tops[lm_r * {lanes} + lm_lane] = lm_nan ? NAN : lm_top;",
                     f"        {d.barrier}"]
    # -- the row's new max from its lanes' (every lane alike), then this lane's share of the weights
    lines += ["        lm_top = -INFINITY;", "        lm_nan = 0;",
              f"        for (int lm_u = 0; lm_u < {lanes}; lm_u++) {{",
              f"            const float lm_a = lm_tops[lm_r * {lanes} + lm_u];",
              "            lm_top = lm_top > lm_a ? lm_top : lm_a;", "            lm_nan |= lm_a != lm_a;", "        }",
              "        if (lm_nan) lm_top = NAN;  /* max_reduce propagates NaN */",
              f"        const float lm_mnew = {vmax.format('lm_m', 'lm_top')};",
              "        const float lm_shift = lm_mnew == -INFINITY ? 0.0f : lm_mnew;  /* a row masked so far: weights 0 */",
              f"        const int lm_live = exp2f((lm_top - lm_shift) * {c}) != 0.0f || lm_top != lm_top;",
              f"        const float lm_alpha = lm_m == lm_mnew ? 1.0f : exp2f((lm_m - lm_shift) * {c});",
              "        lm_m = lm_mnew;",
              "        float lm_part = 0.0f;",
              f"        for (int lm_jj = lm_lane; lm_jj < {keys}; lm_jj += {lanes}) {{",
              f"            const float lm_w = exp2f((lm_s[lm_r * {keys} + lm_jj] - lm_shift) * {c});",
              f"            lm_p[lm_r * {keys} + lm_jj] = lm_w;", "            lm_part += lm_w;", "        }",
              f"        lm_sums[lm_r * {lanes} + lm_lane] = lm_part;",
              f"        {d.barrier}",
              "        if (lm_live) {", "            float lm_total = 0.0f;",
              f"            for (int lm_u = 0; lm_u < {lanes}; lm_u++) lm_total += lm_sums[lm_r * {lanes} + lm_u];",
              "            lm_l = lm_l * lm_alpha + lm_total;", "            #pragma unroll",
              f"            for (int lm_c = 0; lm_c < {owned}; lm_c++) lm_acc[lm_c] *= lm_alpha;",
              f"            for (int lm_jj = 0; lm_jj < {keys}; lm_jj++) {{",  # (each weight read once, each value once)
              f"                const float lm_w = lm_p[lm_r * {keys} + lm_jj];", "                #pragma unroll",
              f"                for (int lm_c = 0; lm_c < {owned}; lm_c++) lm_acc[lm_c] += lm_w * lm_v[lm_jj * {D} + lm_lane + {lanes} * lm_c];",
              "            }", "        }",
              f"        {d.barrier}  /* the block's keys and values are read: the next block may overwrite them */",
              "    }"]
    # -- the epilogue: the kernel's value with the sum, its row max and row sum from the accumulators
    names = accumulated(kernel, plan, j, row_sum="lm_l", row_max="lm_m")
    product = Const(1.0)
    for f in factors(plan.total.body):
        if j not in depends_on(f):
            product = Apply("mul", (product, f))
    lines += [f"    if (lm_i0 + lm_r < {M}) {{", f"        for (int lm_c = 0; lm_c < {owned}; lm_c++) {{",
              f"            const {ix} {col.name} = lm_lane + {lanes} * lm_c;"]
    em = Emitter(program, d, "            ", names)
    em.count = count
    em.names[plan.total] = f"({em.emit(product)} * lm_acc[lm_c])"
    result = em.emit(kernel.value)
    store = f"b{kernel.out}[{flat_index(kernel.loop_vars, kernel.shape).render_c()}]"
    return lines + em.lines + [f"            {store} = {result};", "        }", "    }"]


def _skip_dead_blocks(plan: OnlinePlan, s: Online, d: Dialect, emit, j: str, N: str, c: str) -> list[str]:
    """Code at the top of a key block that skips it when it changes nothing for any row of the
    work-group: the score is affine in the dot product with slope 0 on the whole block (every
    position masked) and every weight would be 0 for rows that have seen a key (a causal
    mask's future keys: half the blocks). Exact, as the CPU form's skip (backends/cpu/online.py),
    for finite inputs. None when the score is not affine in the dot product."""
    rise = slope(plan.score, plan.dot)
    if rise is None:
        return []
    at_zero_lines, at_zero = emit(plan.score, "                ", {plan.dot: "0.0f"})
    rise_lines, rise_value = emit(rise, "                ")
    return ["        if (lm_lid == 0) lm_flag[0] = 1;", f"        {d.barrier}", "        {",
            "            float lm_top0 = -INFINITY;", "            int lm_dotless = 1, lm_nan0 = 0;",
            f"            for (int lm_jj = lm_lane; lm_jj < {s.keys}; lm_jj += {s.lanes}) {{",
            f"                const {d.index} {j} = min(lm_j0 + lm_jj, ({d.index})({N}) - 1);"] + \
        at_zero_lines + rise_lines + \
        [f"                lm_dotless &= {rise_value} == 0.0f;", f"                lm_nan0 |= {at_zero} != {at_zero};",
         f"                lm_top0 = lm_j0 + lm_jj < {N} && {at_zero} > lm_top0 ? {at_zero} : lm_top0;", "            }",
         f"            if (!(lm_dotless && !lm_nan0 && lm_m != -INFINITY && exp2f((lm_top0 - lm_m) * {c}) == 0.0f)) lm_flag[0] = 0;",
         "        }", f"        {d.barrier}", "        const int lm_skip = lm_flag[0];",
         f"        {d.barrier}  /* (every work-item has read the flag before the next block sets it) */",
         "        if (lm_skip) continue;"]


def launch_online(kernel: Kernel, s: Online, value) -> tuple[tuple, tuple] | None:
    """(global, local) work sizes: lanes x (row blocks x rows) x batch."""
    rows, batch = value(kernel.shape[-2]), value(numel(kernel.shape[:-2]))
    if not rows * batch:
        return None
    return (s.lanes, -(-rows // s.rows) * s.rows, batch), (s.lanes, s.rows, 1)


def fits(kernel: Kernel, plan: OnlinePlan, s: Online, max_group: int, local_bytes: int) -> bool:
    """Whether the device can run the form: its work-group size, its local memory, whole output columns per lane."""
    head, dot = kernel.shape[-1].value, plan.dot.extent.value
    return s.group <= max_group and s.local_floats(head, dot) * 4 <= local_bytes and head % s.lanes == 0
