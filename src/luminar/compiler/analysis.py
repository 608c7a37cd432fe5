"""Backend-neutral analysis of a kernel: its row x column structure, strides, and work.

Every target reads kernels through these facts (the CPU's tiles and the search's rule guards
alike), so each is computed by one function here, never re-derived by a backend.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..symbolic import Expr, Var, sym
from .kernels import Apply, Const, Gather, Kernel, Load, Reduce, Select, children, depends_on, numel, walk

PRECOMPUTED = 1 << 24  # floats (64 MB): the largest buffer of row or panel operands computed before the tiles


def row_values(kernel: Kernel) -> bool:
    """Whether the kernel holds reductions that do not depend on its innermost output index
    (row values: a softmax's max and sum, a norm's mean): the plain schedule computes them once
    per row, before the loop over the row."""
    inner = kernel.loop_vars[-1].name if kernel.shape else None
    return inner is not None and any(isinstance(n, Reduce) and inner not in depends_on(n) for n in walk(kernel.value))


@dataclass
class TilePlan:
    """The row x column structure of a kernel's reduction, which tiled schedules exploit.

    Each step of the reduction updates a block of accumulators (rows x columns of the output)
    from row values (subtrees of the body that depend on the row, not the column) and panel
    values (depend on the column, not the row). Panels are computed once per column block into
    a contiguous buffer (packing: a dequantized weight is dequantized once per block, a strided
    B is read in order), so the inner loop is a unit-stride, vectorizable update.
    """
    reduce: Reduce
    i: Var | None  # the tile's row variable (second-innermost output dim), None for 1-d outputs
    j: Var  # the tile's column variable (innermost output dim)
    rows: list  # IR subtrees that depend on the row (and reduction), not the column
    panels: list  # IR subtrees that depend on the column (and reduction), not the row


def stride(index: Expr, var: Var):
    """How far `index` moves when `var` grows by one, if that is a constant; else None."""
    step = index.substitute({var.name: var + 1}) - index
    return step.value if step.is_const else None


def plan_tiles(kernel: Kernel) -> TilePlan | None:
    """The kernel's TilePlan, or None: it needs exactly one reduction, with no reduction or
    gather inside its body, and whatever stays in the inner loop (neither row nor panel) must
    run in order along the columns."""
    red = single_reduce(kernel)
    if red is None or not kernel.shape or any(isinstance(n, Gather) for n in walk(kernel.value)):
        return None
    i, j = (kernel.loop_vars[-2] if len(kernel.loop_vars) > 1 else None), kernel.loop_vars[-1]
    if any(isinstance(n, Reduce) for n in walk(red.body)) or j.name not in depends_on(red):
        return None  # (a reduction not over columns is a row value: see row_values)
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
    inner = [ld for ld in walk(red.body, skip=set(rows + panels)) if isinstance(ld, Load)]
    if any(stride(ld.index, j) not in (0, 1) for ld in inner):
        return None
    return TilePlan(red, i, j, rows, panels)


def packable_rows(kernel: Kernel, plan: TilePlan) -> bool:
    """Whether the row operands cost more than a plain load per step -- computed (an input
    normalized on the fly) or gathered through a window (a convolution's padded, strided input:
    a validity test and a div/mod index) -- and fit a buffer of PRECOMPUTED floats (a batch of
    images' windows would not): then they are worth computing once before the tiles."""
    size = numel(kernel.shape[:-1]) * plan.reduce.extent * len(plan.rows)
    return plan.i is not None and not (size.is_const and size.value > PRECOMPUTED) and any(
        not isinstance(e, Load) or e.valid != sym(1) or stride(e.index, plan.reduce.var) is None for e in plan.rows)


def vector_body(plan: TilePlan):
    """(row, panel) when the reduction body is one row value times one panel value summed (a
    matmul, also with a dequantized weight): what the vector micro-kernel computes; else None."""
    body = plan.reduce.body
    if plan.reduce.op != "sum_reduce" or len(plan.rows) != 1 or len(plan.panels) != 1:
        return None
    if not (isinstance(body, Apply) and body.op == "mul" and set(body.args) == {plan.rows[0], plan.panels[0]}):
        return None
    return plan.rows[0], plan.panels[0]


def windowed(plan: TilePlan) -> bool:
    """Whether the panel operands are windows of an input (a convolution's weight gradient reads
    the padded input at position + kernel offset): loads behind a validity test or with index
    math dividing the column or the reduction step. Such panels are computed once, over their
    digits, before the tiles, and each column block's pack copies them."""
    return bool(plan.panels) and all(isinstance(e, Load) for e in plan.panels) and any(
        e.valid != sym(1) or stride(e.index, plan.reduce.var) is None or stride(e.index, plan.j) is None
        for e in plan.panels)


def reduce_work(e) -> Expr:
    """Iterations of the reductions per output element (1 when there are none): nested ones
    multiply, side by side ones (a norm's row values) add."""
    if isinstance(e, Reduce):
        return e.extent * reduce_work(e.body)
    parts = [w for w in map(reduce_work, children(e)) if w != sym(1)]
    return sum(parts[1:], parts[0]) if parts else sym(1)


def single_reduce(kernel: Kernel) -> Reduce | None:
    reduces = [n for n in walk(kernel.value) if isinstance(n, Reduce)]
    return reduces[0] if len(reduces) == 1 else None


def value_at(extent, env) -> int:
    """A dim expression's value for these dim values."""
    return int(extent.evaluate(env)) if not extent.is_const else extent.value


def work(kernel: Kernel) -> Expr:
    """Inner iterations of the whole kernel: its outputs times their reduction work. The one work
    estimate: a target's threading threshold and the search's size test both read it."""
    return numel(kernel.shape) * reduce_work(kernel.value)
