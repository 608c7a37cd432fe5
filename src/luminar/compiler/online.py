"""The online-softmax rewrite: attention as one pass over the keys (flash attention).

A naive attention graph (q @ k^T, scale, mask, softmax, @ v) lowers to three kernels with two
S x S buffers between them. Inlined into one kernel, its output element is

    out[i, d] = F_i * sum_j exp2((A[i, j] - M_i) * c) * V[j, d]    with  M_i = max_j A[i, j]

where A[i, j] (the score) holds sum_k q[i, k] * key[j, k], and F_i collects what does not depend
on j (the reciprocal of the row sum L_i = sum_j exp2((A[i, j] - M_i) * c)). Computed as written,
M_i and L_i need passes over the scores before the weighted sum. The recurrence

    m' = max(m, max of a block's scores);  l = l * 2^((m - m') c) + sum_j 2^((a_j - m') c);
    acc[d] = acc[d] * 2^((m - m') c) + sum_j 2^((a_j - m') c) * V[j, d]

gives M_i = m, L_i = l and the sum = acc after ONE pass over blocks of keys, so the scores are
never stored. `online_plan` recognizes that form in a kernel (the backend renders it tiled:
backends/cpu/online.py); `fusion_regions` proposes which realized nodes to inline to get it, and the
search keeps the fused program only if it measures faster (compiler/search.py); without search,
the target's rule decides (the CPU fuses every region that reaches the online form).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..symbolic import Var
from .kernels import Apply, Const, Kernel, Reduce, depends_on, same, substitute, walk


@dataclass(frozen=True)
class OnlinePlan:
    total: Reduce  # the weighted sum over keys: sum_j weight * value (its var is the key index j)
    weight: Apply  # exp2((score - maximum) * scale)
    score: object  # A[i, j]
    maximum: Reduce  # M_i = max over j of the score
    scale: float  # c > 0
    value: object  # V[j, d]: the product of the body's factors that depend on the column d
    dot: Reduce  # the reduction inside the score: sum_k query * key
    query: object  # q[i, k]: depends on the row, not the key
    key: object  # key[j, k]: depends on the key, not the row


def factors(e) -> list:
    """The operands of a product tree (e itself when it is not a product)."""
    if isinstance(e, Apply) and e.op == "mul":
        return factors(e.args[0]) + factors(e.args[1])
    return [e]


def product(parts: list):
    """parts[0] * parts[1] * ..., multiplied left to right: the tree `factors` takes apart."""
    return functools.reduce(lambda a, b: Apply("mul", (a, b)), parts)


def _shifted_exp(e, j: str):
    """(score, maximum, c) when e is exp2((score - max_j score) * c) with c > 0, else None.
    (score - m) is spelled score + m * -1 by the op library, operands in either order.)"""
    if not (isinstance(e, Apply) and e.op == "exp2" and isinstance(e.args[0], Apply) and e.args[0].op == "mul"):
        return None
    scaled, c = e.args[0].args
    if isinstance(scaled, Const):
        scaled, c = c, scaled
    if not (isinstance(c, Const) and c.value > 0 and isinstance(scaled, Apply) and scaled.op == "add"):
        return None
    for score, neg in (scaled.args, scaled.args[::-1]):
        m = [f for f in factors(neg) if isinstance(f, Reduce)]
        if len(m) == 1 and factors(neg) in ([m[0], Const(-1.0)], [Const(-1.0), m[0]]) and m[0].op == "max_reduce" \
                and same(substitute(m[0].body, {m[0].var.name: Var(j, *m[0].var.bounds())}), score):
            return score, m[0], c.value
    return None


def online_plan(kernel: Kernel) -> OnlinePlan | None:
    """The kernel's attention structure (see the module doc), or None. Needs output dims
    (..., i, d), exactly one sum over keys that depends on d, one shifted exponential of the
    scores in its body, value factors free of the row, and a score holding exactly one dot
    product of a row factor and a key factor, none of which depend on d. (The renderer also
    wants d a multiple of 16 and the dot product's length known, both at most 512.)"""
    if len(kernel.shape) < 2 or not kernel.shape[-1].is_const:
        return None
    i, d = (v.name for v in kernel.loop_vars[-2:])
    totals = {n for n in walk(kernel.value) if isinstance(n, Reduce) and n.op == "sum_reduce" and d in depends_on(n)}
    if len(totals) != 1:
        return None
    (total,) = totals
    j = total.var.name
    inside = [f for f in factors(total.body) if j in depends_on(f)]
    shifted = [(f, found) for f in inside if (found := _shifted_exp(f, j)) is not None]
    if len(shifted) != 1 or len(inside) < 2:
        return None
    weight, (score, maximum, scale) = shifted[0]
    values = [f for f in inside if f is not weight]
    if maximum.extent != total.extent:
        return None  # (the max over other keys than the sum's: not a softmax over them)
    if any(i in depends_on(f) for f in values) or d in depends_on(weight) or \
            any(d in depends_on(f) for f in factors(total.body) if j not in depends_on(f)):
        return None  # (a factor outside the sum that depends on d stays correct, but keep it simple)
    value = product(values)
    dots = {n for n in walk(score) if isinstance(n, Reduce)}
    if len(dots) != 1:
        return None
    (dot,) = dots
    parts = factors(dot.body)
    if dot.op != "sum_reduce" or len(parts) != 2 or j not in depends_on(dot) or not dot.extent.is_const \
            or kernel.shape[-1].value % 16 or not 0 < dot.extent.value <= 512 or kernel.shape[-1].value > 512:
        return None
    query, key = parts if j not in depends_on(parts[0]) else parts[::-1]
    if j in depends_on(query) or i in depends_on(key):
        return None
    return OnlinePlan(total, weight, score, maximum, scale, value, dot, query, key)


def fusion_regions(lowering) -> list[tuple[int, frozenset]]:
    """Candidate node sets to inline for online-softmax kernels, as (node, set): each realized
    node with a single consumer that holds row values (softmax probabilities) with its inlined
    expression, plus the realized nodes read only from inside that expression (the scores)."""
    graph, realized = lowering.graph, lowering.realized
    uses = {n: {user.id for user, _ in users} for n, users in lowering.uses.items()}
    outputs = {node.id for node, _ in graph.outputs.values()}
    regions = []
    for p in graph.nodes:
        if p.id not in realized or p.id in outputs or p.op == "input" or len(uses.get(p.id, ())) != 1 \
                or not lowering.row_values[p.id]:
            continue
        inside, stack, read = {p.id}, [p], set()
        while stack:  # p's inlined expression, and the realized nodes it reads
            for src, _ in stack.pop().srcs:
                if src.id not in inside and src.op != "input":
                    inside.add(src.id)
                    read.add(src.id) if src.id in realized else stack.append(src)
        # every node of the region is inlined: with the scores inlined, the exponentials (read twice)
        # would otherwise get a buffer of their own
        regions.append((p.id, frozenset(inside - read | {r for r in read if uses[r] <= inside and r not in outputs})))
    return regions


def absorbed_by(lowering, node_id: int) -> int | None:
    """The realized node whose kernel computes `node_id` inlined (following single consumers)."""
    while node_id not in lowering.realized:
        users = lowering.uses.get(node_id, [])
        if len(users) != 1:
            return None
        node_id = users[0][0].id
    return node_id


def slope(e, target):
    """d e / d target when `e` is affine in `target` (which occurs once, under adds and products
    with target-free operands), as an IR expression free of target; else None."""
    if e == target:
        return Const(1.0)
    if not (isinstance(e, Apply) and e.op in ("add", "mul")):
        return None
    holders = [k for k, a in enumerate(e.args) if target in set(walk(a))]
    if len(holders) != 1:
        return None
    inner = slope(e.args[holders[0]], target)
    return inner if inner is None or e.op == "add" else Apply("mul", (inner, e.args[1 - holders[0]]))


def accumulated(kernel: Kernel, plan: OnlinePlan, j: str, row_sum: str, row_max: str) -> dict:
    """The kernel's reductions an online form's accumulators hold, named for its epilogue: the row
    max, and each other sum over the keys of the plan's weights (the softmax's denominator)."""
    names = {plan.maximum: row_max}
    for n in walk(kernel.value):
        if isinstance(n, Reduce) and n.op == "sum_reduce" and n is not plan.total and n.extent == plan.total.extent and \
                same(substitute(n.body, {n.var.name: Var(j, *n.var.bounds())}), plan.weight):
            names[n] = row_sum
        elif isinstance(n, Reduce) and n.op == "max_reduce" and same(n, plan.maximum):
            names[n] = row_max
    return names
