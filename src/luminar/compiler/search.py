"""Search: pick each kernel's schedule by rewriting its loop nest in an e-graph and timing candidates.

The kernel IR says what a kernel computes; a Schedule (backends/cpu.py) says how its loops run.
Without search every kernel gets the rule-chosen default schedule. With search:

1. Kernels are deduplicated by a structural fingerprint (buffers and loop variables renamed,
   constant offsets dropped), so a model's repeated layers are searched once.
2. A kernel's loop nest becomes an egglog term: ``Root(loop(dim, span, step, kind, inner))``
   down to ``body()``, one loop per output dim plus the reduction ``r``. Facts about the kernel
   (extents, tile factors from SIMD widths and divisors, unit strides, which dims may be tiled,
   whether operands can be packed) guard small local rewrite rules, run in stages, one
   iteration at a time, within a node and a time limit:
     tile      split a loop into blocks of a factor (whole loops, or blocks into smaller blocks)
     order     hoist a block loop out of another dim's loop (interchange); sink the reduction
               outside a small spatial loop (a register tile of accumulators)
     annotate  vectorize an innermost unit-stride loop; unroll register rows; parallelize the
               outer loops; pack the panel operands into a local buffer below a block loop;
               pack the row operands into a buffer before all loops
   A split reduction is a split of ``r``: left innermost and vectorized, partial accumulators
   (lanes); hoisted above the tile, reduction blocks.
3. Many distinct terms are sampled from the saturated e-graph (seeded, backtracking out of
   shapes no renderer implements), each mapped back to a Schedule and ranked by a roofline cost
   model; the best of each family plus the default are compiled in one batch (two translation
   units built concurrently), run on random inputs sized for the shape bucket and checked: at
   sampled output positions against the plain loop body (the oracle), everywhere against the
   default. A failing candidate never wins; failures are counted and shown by `explain`. The
   others are timed (validation is the warm-up; interleaved rounds; median) and the fastest kept.
4. Results go to a tuning cache on disk keyed by kernel structure, shape bucket, seed, machine
   and the search's and renderer's own code, written atomically. The whole compile's search has
   a time budget; kernels left when it is spent keep the default (and are not cached).

Before the schedules, the fusion choice (search_fusion). Each softmax region the lowering would
give a buffer (compiler/online.py) is an e-graph term ``Read.stored(node)``: how its consumer gets
its value. The fuse ruleset grows the other forms, each rule guarded by a fact: fuse (stored ->
inlined, where inlining is legal), un-fuse (inlined -> stored) and the online-softmax recurrence
(inlined -> online, where the consumer's weighted sum of exponentials matches online_plan). Each
form of a region's e-class is a candidate: the fused kernel is validated against the unfused
kernels run on the same random inputs, the online form's block sizes and the inlined form's plain
loops (only for a few output columns: they recompute the region per column) are timed, and the
fastest is kept only if it beats the kernels it replaces.

The candidate set is a pure function of the kernel, the bucket and the seed; which candidate
wins depends on measurements (a candidate within NOISE of an earlier one in the ranked order
does not displace it), and is then cached, so later compiles are deterministic and fast.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from ..backends import cc
from ..backends.cpu import (ONLINE_KEYS, ONLINE_ROWS, PRELUDE, VECTOR_LANES, Schedule, default_schedule, plan_tiles, render_kernel,
                            render_oracle)
from ..errors import DimensionError, UnsupportedError, ValueDomainError
from .kernels import (Apply, Gather, IndexValue, Kernel, KernelProgram, Load, Reduce, Select, depends_on, loads,
                      numel, walk)

SEARCH_VERSION = 1  # part of every tuning-cache key: bump when candidates or rendering change
DEFAULT_BUDGET_S = 30.0  # search=True: seconds for the whole compile's search
DEFAULT_DIM = 128  # a symbolic dim's value in the shape bucket searched, unless search_dims says
MIN_WORK = 1 << 16  # kernels with fewer inner iterations than this keep the default (not worth timing)
NODE_LIMIT, SATURATE_S = 20_000, 1.0  # e-graph rows and seconds; saturation stops beyond either
SAMPLES, TIMED = 400, 8  # terms sampled from the e-graph; candidates compiled and timed per kernel
NOISE = 0.03  # a later candidate must be this much faster to win
RTOL = 1e-3  # a candidate's output must match the oracle's within this (relative to the output's scale)
SAMPLE_S = 0.002  # a timing sample repeats the call until it lasts about this long
PROGRESS_AFTER_S = 2.0  # a search running longer than this reports each kernel on stderr


# -- options --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchOptions:
    budget_s: float
    dims: dict
    seed: int


def options(search=None, search_dims=None, seed=0, dims=()) -> SearchOptions | None:
    """Validate compile options; None when search is off. `search` is False/True/seconds; when
    None, the environment variable LUMINAR_SEARCH decides (0/1/seconds)."""
    if search is None:
        env = os.environ.get("LUMINAR_SEARCH", "").strip()
        try:
            search = False if env in ("", "0") else True if env == "1" else float(env)
        except ValueError:
            raise ValueDomainError(f"LUMINAR_SEARCH={env!r}: expected 0, 1 or a number of seconds") from None
    if isinstance(search, bool) or search is None:
        budget = DEFAULT_BUDGET_S if search else None
    elif isinstance(search, (int, float)) and search > 0 and np.isfinite(search):
        budget = float(search)
    else:
        raise ValueDomainError(f"compile option search={search!r}: expected False, True or a positive number of seconds")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise ValueDomainError(f"compile option seed={seed!r}: expected an int")
    bucket = {d: DEFAULT_DIM for d in dims}
    for name, value in (search_dims or {}).items():
        if name not in bucket:
            raise DimensionError(f"compile option search_dims: {name!r} is not a symbolic dim of this graph "
                                 f"(its dims: {sorted(bucket)})")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise DimensionError(f"compile option search_dims[{name!r}] = {value!r}: expected an int >= 1")
        bucket[name] = int(value)
    return None if budget is None else SearchOptions(budget, bucket, int(seed))


# -- kernel structure -------------------------------------------------------------------------------
def fingerprint(program: KernelProgram, kernel: Kernel) -> str:
    """The kernel's structure as text: buffers numbered by first use (with their storage dtype),
    reduction and gather variables renamed in order, constant offsets of loads dropped (layer k of
    a stacked cache reads at another offset but schedules the same)."""
    from ..symbolic import Sum, Var
    numbers, rename = {}, {}

    def text(e) -> str:
        if isinstance(e, Load):
            index = e.index.substitute(rename)
            index = index - index.const if isinstance(index, Sum) else index
            number = numbers.setdefault(e.buffer, len(numbers))
            return f"L{number}:{program.buffers[e.buffer].dtype}[{index} if {e.valid.substitute(rename)}]"
        if isinstance(e, (Reduce, Gather)):
            rename[e.var.name] = Var(f"_q{len(rename)}", *e.var.bounds())
            inner = text(e.body)
            head = e.op if isinstance(e, Reduce) else f"gather({text(e.index)})"
            return f"{head}({rename[e.var.name]}<{e.extent.substitute(rename)}: {inner})"
        if isinstance(e, Apply):
            return f"{e.op}({', '.join(text(a) for a in e.args)})"
        if isinstance(e, Select):
            return f"select({e.cond.substitute(rename)}, {text(e.value)})"
        if isinstance(e, IndexValue):
            return f"index({e.expr.substitute(rename)})"
        return repr(e)
    return f"{tuple(map(str, kernel.shape))} {text(kernel.value)}"


def single_reduce(kernel: Kernel) -> Reduce | None:
    reduces = [n for n in walk(kernel.value) if isinstance(n, Reduce)]
    return reduces[0] if len(reduces) == 1 else None


def _value(extent, env) -> int:
    return int(extent.evaluate(env)) if not extent.is_const else extent.value


# -- the e-graph: loop nests as terms, and the rewrite rules ------------------------------------
@functools.cache
def _model():
    """The egglog sorts, fact relations and staged rulesets (built once, on first use: importing
    egglog takes ~0.3 s, which a compile without search should not pay)."""
    try:
        from egglog import Expr, String, StringLike, i64, i64Like, ne, relation, rewrite, ruleset, var, vars_
    except ImportError:
        raise UnsupportedError("compile(..., search=...) needs the egglog package: pip install egglog==13.2.0") from None

    class Nest(Expr):
        @classmethod
        def body(cls) -> Nest: ...  # noqa: F821 - one step of the computation (an element, a reduction step)

        @classmethod
        def loop(cls, dim: StringLike, span: i64Like, step: i64Like, kind: StringLike, inner: Nest) -> Nest: ...  # noqa: F821

        @classmethod
        def pack(cls, inner: Nest) -> Nest: ...  # noqa: F821 - panels copied into a local buffer here

        @classmethod
        def pack_rows(cls, inner: Nest) -> Nest: ...  # noqa: F821 - row operands computed into a buffer first

    class Root(Expr):
        def __init__(self, nest: Nest) -> None: ...

    class Read(Expr):  # how a consumer kernel gets a fusion region's value (the region by graph node id)
        @classmethod
        def stored(cls, node: i64Like) -> Read: ...  # noqa: F821 - the region's own kernels write a buffer

        @classmethod
        def inlined(cls, node: i64Like) -> Read: ...  # noqa: F821 - computed inside the consumer's loops

        @classmethod
        def online(cls, node: i64Like) -> Read: ...  # noqa: F821 - inlined, the consumer's weighted sum as
        #                                               the online-softmax recurrence (compiler/online.py)

    facts = {"extent": relation("extent", String, i64), "factor": relation("factor", String, i64),
             "subfactor": relation("subfactor", String, i64, i64), "spatial": relation("spatial", String),
             "unit": relation("unit", String), "tileable": relation("tileable", String),
             "register": relation("register", String), "packable": relation("packable"),
             "rows_packable": relation("rows_packable"), "fusable": relation("fusable", i64),
             "online_form": relation("online_form", i64)}
    fact = facts
    d, e, k, k2 = vars_("d e k k2", String)
    sp, st, sp2, st2, f = vars_("sp st sp2 st2 f", i64)
    x = var("x", Nest)
    L = Nest.loop
    tile = ruleset(
        # split a whole loop into blocks of f (edge blocks are clamped, so f need not divide it)
        rewrite(L(d, sp, 1, "s", x)).to(L(d, sp, f, "s", L(d, f, 1, "s", x)), fact["factor"](d, f), fact["extent"](d, sp),
                                        sp >= f),
        # split a block (a row block) into smaller blocks that divide it (register-tile rows)
        rewrite(L(d, sp, 1, "s", x)).to(L(d, sp, f, "s", L(d, f, 1, "s", x)), fact["subfactor"](d, sp, f)),
        name="tile")
    order = ruleset(
        # interchange: a block loop moves out of another dim's loop (same-dim loops are nested blocks)
        rewrite(L(d, sp, st, k, L(e, sp2, st2, k2, x))).to(L(e, sp2, st2, k2, L(d, sp, st, k, x)),
                                                           ne(d).to(e), st2 > 1, fact["tileable"](d), fact["tileable"](e)),
        # the reduction moves out of a small spatial loop: that loop's outputs accumulate in registers
        rewrite(L(d, sp, 1, k, L("r", sp2, 1, k2, x))).to(L("r", sp2, 1, k2, L(d, sp, 1, k, x)),
                                                          fact["register"](d), sp <= 64),
        name="order")
    annotate = ruleset(
        rewrite(L(d, sp, 1, "s", Nest.body())).to(L(d, sp, 1, "vec", Nest.body()), fact["unit"](d)),
        rewrite(L(d, sp, 1, "s", L(e, sp2, 1, "vec", x))).to(L(d, sp, 1, "unroll", L(e, sp2, 1, "vec", x)),
                                                             fact["register"](d), sp <= 16),
        rewrite(Root(L(d, sp, st, "s", x))).to(Root(L(d, sp, st, "par", x)), fact["spatial"](d)),
        rewrite(Root(L("r", sp, st, "s", L(e, sp2, st2, "s", x)))).to(
            Root(L("r", sp, st, "s", L(e, sp2, st2, "par", x))), fact["spatial"](e), st > 1),
        rewrite(L(d, sp, st, "par", L(e, sp2, st2, "s", x))).to(L(d, sp, st, "par", L(e, sp2, st2, "par", x)),
                                                                fact["spatial"](e)),
        rewrite(L(d, sp, st, k, L(e, sp2, st2, k2, x))).to(L(d, sp, st, k, Nest.pack(L(e, sp2, st2, k2, x))),
                                                           fact["packable"](), st > 1),
        rewrite(Root(L(d, sp, st, k, x))).to(Root(Nest.pack_rows(L(d, sp, st, k, x))), fact["rows_packable"]()),
        name="annotate")
    node = var("node", i64)
    fuse = ruleset(
        rewrite(Read.stored(node)).to(Read.inlined(node), fact["fusable"](node)),  # fuse into the consumer
        rewrite(Read.inlined(node)).to(Read.stored(node)),  # un-fuse: always legal
        # max-reduce / exp / sum-reduce weighting a sum -> running max with a rescaled running sum
        rewrite(Read.inlined(node)).to(Read.online(node), fact["online_form"](node)),
        name="fuse")
    return Nest, Root, facts, (tile, order, annotate), Read, fuse


@dataclass
class Space:
    """What the search knows about one kernel: its naive loop nest and the facts guarding the rules.
    A nest is a tuple of ("loop", dim, span, step, kind) and ("pack",) items, outer to inner."""
    naive: tuple
    facts: list


def space(kernel: Kernel, env: dict) -> Space:
    """Dims are the kernel's loop variables plus "r" for its reduction (when it has exactly one).
    Tile factors come from SIMD widths (columns: multiples of 16 floats), register-tile heights,
    cache-sized row and reduction blocks, and lane counts for split reductions."""
    from ..backends.cpu import _stride, packable_rows, plan_tiles
    names = [v.name for v in kernel.loop_vars]
    extents = [_value(x, env) for x in kernel.shape]
    nest = [("loop", n, x, 1, "s") for n, x in zip(names, extents)]
    facts = [("extent", n, x) for n, x in zip(names, extents)] + [("spatial", n) for n in names]
    red, plan = single_reduce(kernel), plan_tiles(kernel)
    if red is not None:
        k_n = _value(red.extent, env)
        nest.append(("loop", "r", k_n, 1, "s"))
        facts.append(("extent", "r", k_n))
        if not any(isinstance(n, (Reduce, Gather)) for n in walk(red.body)) and \
                all(_stride(ld.index, red.var) in (0, 1) for ld in loads(red.body)):
            facts += [("unit", "r"), ("tileable", "r")] + [("factor", "r", n) for n in (16, 32, 64) if 2 * n <= k_n]
    elif names and all(_stride(ld.index, kernel.loop_vars[-1]) in (0, 1) for ld in loads(kernel.value)):
        facts.append(("unit", names[-1]))
    if plan is not None:
        j, m_n, n_n = names[-1], (extents[-2] if plan.i is not None else 1), extents[-1]
        facts += [("tileable", j), ("register", j), ("unit", j), ("tileable", "r")]
        facts += [("factor", j, f) for f in [f for f in (16, 32, 48, 64) if f <= n_n] or [n_n]]
        facts += [("factor", "r", f) for f in (256,) if f < k_n]  # a reduction block whose 32-column panel fits L1
        if plan.i is not None:
            i = names[-2]
            facts += [("tileable", i), ("register", i)]
            heights, blocks = [f for f in (2, 4, 6, 8, 12) if f <= m_n], [f for f in (32, 64, 128, 256) if f < m_n]
            facts += [("factor", i, f) for f in heights + blocks]
            facts += [("subfactor", i, b, f) for b in blocks for f in heights if b % f == 0]
        if plan.panels:
            facts.append(("packable",))
        if packable_rows(kernel, plan):
            facts.append(("rows_packable",))
    return Space(tuple(nest), list(dict.fromkeys(facts)))


def saturate(sp: Space):
    """An e-graph holding the naive nest and every nest the staged rulesets reach from it."""
    Nest, Root, relations, stages, *_ = _model()
    from egglog import EGraph
    egraph = EGraph()
    for name, *args in sp.facts:
        egraph.register(relations[name](*args))
    term = Nest.body()
    for _, dim, span, step, kind in reversed(sp.naive):
        term = Nest.loop(dim, span, step, kind, term)
    egraph.register(Root(term))
    deadline = time.perf_counter() + SATURATE_S
    for stage in stages:  # each stage to its fixed point, one iteration at a time, within the limits
        for _ in range(12):
            report = egraph.run(stage)
            if not report.updated or sum(size for _, size in egraph.all_function_sizes()) > NODE_LIMIT \
                    or time.perf_counter() > deadline:
                break
    return egraph


def sample(egraph, count: int, seed: int, viable, complete) -> list[tuple]:
    """Up to `count` distinct nests from the e-graph, each drawn from the root choosing one e-node
    per e-class in a seeded random order, backtracking out of prefixes `viable(prefix, item)`
    rejects and out of whole nests `complete` rejects (those no renderer implements)."""
    raw = egraph._egraph  # the frozen view: every e-class with its e-nodes, without re-parsing terms
    classes, root = {}, None
    for name, fn in raw.freeze().functions.items():
        for row in fn.rows:
            if name.endswith("Nest_loop"):
                dim, span, step, kind, inner = row.inputs
                node = ("loop", raw.value_to_string(dim), raw.value_to_i64(span), raw.value_to_i64(step),
                        raw.value_to_string(kind), inner)
            elif name.endswith("Nest_pack"):
                node = ("pack", row.inputs[0])
            elif name.endswith("Nest_pack_rows"):
                node = ("rows", row.inputs[0])
            elif name.endswith("Nest_body"):
                node = ("body", None)
            elif name.endswith("Root___init__"):
                node, root = ("root", row.inputs[0]), row.output
            else:
                continue
            classes.setdefault(row.output, []).append(node)
    for nodes in classes.values():  # an order that depends on the graph's content only
        nodes.sort(key=lambda n: (n[0], n[1:-1], str(n[-1])))
    rng = np.random.default_rng(seed)
    visits = [0]

    def draw(cls, prefix):
        nodes = classes[cls]
        for k in rng.permutation(len(nodes)):
            visits[0] += 1
            node = nodes[k]
            if node[0] == "body":
                if complete(prefix):
                    return prefix
                continue
            item = node[:-1] if node[0] != "root" else None
            if visits[0] > 5000 or item is not None and not viable(prefix, item):
                continue
            found = draw(node[-1], prefix + ((item,) if item else ()))
            if found is not None:
                return found
        return None

    found = {}
    for _ in range(count):
        visits[0] = 0
        nest = draw(root, ())
        if nest is not None:
            found.setdefault(nest, None)
    return list(found)


def viable(kernel: Kernel, tileable: set, packs: bool):
    """The prefix test for `sample`: the shapes to_schedule accepts, checked as a nest grows.
    Untileable (batch) loops come first in order; a pack appears at most once; each dim is split
    at most twice, never twice by the same step; once the point loops of the tile have begun,
    the only block that may follow is a reduction split into lanes after all output loops."""
    names = [v.name for v in kernel.loop_vars]
    batch = [n for n in names if n not in tileable]
    orders = ([n for n in names if n in tileable] + ["r"], ["r"] + [n for n in names[-2:] if n in tileable])
    limit = {names[-1]: 64, **({names[-2]: 16} if len(names) > 1 else {})}  # register tile sizes

    def test(prefix, item) -> bool:
        loops = [it for it in prefix if it[0] == "loop"]
        blocks = [it[1] for it in loops if it[3] > 1]
        packed = any(it[0] == "pack" for it in prefix)
        if item[0] == "rows":  # row operands are packed before any loop
            return not prefix
        if item[0] == "pack":  # once, below the column block, above the row-tile loop
            return not packed and names[-1] in blocks and len(set(blocks)) == len(blocks)
        _, dim, span, step, kind = item
        if step > 1 and (dim in blocks and kind != "s" or len(set(blocks)) < len(blocks)
                         or packed and dim in (names[-1], "r")):
            return False  # the row-tile loop is serial and comes last of the blocks; pack after j, k
        if kind == "par" and (packed or any(it[4] != "par" and it[1] != "r" for it in loops)
                              or step == 1 and any(it[3] > 1 for it in loops)):
            return False  # threads split a prefix of the loops, never the tile inside blocks
        if step == 1 and dim in limit and any(it[1] == dim for it in loops) and span > limit[dim]:
            return False
        if dim in batch:
            return [it[1] for it in loops] == batch[:batch.index(dim)]
        if any(it[1] in batch for it in loops) and len({it[1] for it in loops if it[1] in batch}) < len(batch) \
                or any(it[1] == dim and it[3] == step for it in loops) or sum(it[1] == dim for it in loops) > 2:
            return False
        points = [it[1] for it in loops if it[3] == 1 and it[1] not in batch] + [dim] * (step == 1)
        tiled = any(b != "r" for b in blocks) or step > 1 and dim != "r"
        if not any(points == seq[:len(points)] for seq in orders[tiled:]):  # plain: dims then r; tiled: r, i, j
            return False
        if tiled and step == 1 and packs and not packed:
            return False
        started = len(points) > (step == 1)
        if step > 1 and started:
            placed = {it[1] for it in loops if it[3] == 1}
            return dim == "r" and placed >= set(names) and "r" not in placed
        return True
    return test


# -- nests and schedules ----------------------------------------------------------------------------
def to_schedule(nest: tuple, kernel: Kernel, plan, default):
    """The Schedule a nest describes, or None when no renderer implements it."""
    names = [v.name for v in kernel.loop_vars]
    if nest and nest[0][0] == "rows":
        tiled = _tiled_schedule(nest[1:], kernel, plan, default) if plan is not None else None
        return dataclasses.replace(tiled, pack_rows=True) if tiled is not None else None
    if any(item[0] == "pack" or item[3] > 1 and item[1] != "r" for item in nest) or \
            [it[1] for it in nest if it[1] != "r"] != names or any(it[1] == "r" for it in nest[:len(names)]):
        return _tiled_schedule(nest, kernel, plan, default) if plan is not None else None
    loops, reduction = nest[:len(names)], nest[len(names):]
    kinds = [it[4] for it in loops]
    parallel = len(kinds) - len("".join("p" if k == "par" else "s" for k in kinds).lstrip("p"))
    if "par" in kinds[parallel:] or "unroll" in kinds or "vec" in kinds[:-1] or reduction and "vec" in kinds:
        return None
    lanes = reduction[0][3] if len(reduction) == 2 else 1
    if any(it[4] not in ("s", "vec") for it in reduction) or len(reduction) == 2 and reduction[1][3] != 1 \
            or lanes > 64:
        return None
    return Schedule("loops", parallel=parallel, lanes=lanes, simd=bool(kinds) and kinds[-1] == "vec")


def _tiled_schedule(nest, kernel, plan, default):
    """Tiled nests: batch loops, block loops (columns j/tj, rows i/mc, reduction r/kc) and a pack
    in some order, an optional row-tile loop i/ti, then r, i, j point loops (the register tile)."""
    from ..backends.cpu import check_tile_order, vector_body
    names = [v.name for v in kernel.loop_vars]
    i = names[-2] if plan.i is not None else None
    j, batch = names[-1], names[:len(names) - (2 if i else 1)]
    head, rest = nest[:len(batch)], list(nest[len(batch):])
    if any(it[0] != "loop" or it[1] != n or it[3] != 1 for it, n in zip(head, batch)):
        return None
    point = ["r", i, j] if i is not None else ["r", j]
    tail, rest = rest[-len(point):], rest[:-len(point)]
    if len(tail) < len(point) or any(it[0] != "loop" or it[1] != d or it[3] != 1 for it, d in zip(tail, point)):
        return None
    kspan, tj, ti = tail[0][2], tail[-1][2], (tail[1][2] if i is not None else 1)
    mc = ti
    if i is not None and rest and rest[-1][0] == "loop" and rest[-1][1] == i and rest[-1][3] == ti \
            and sum(it[0] == "loop" and it[1] == i for it in rest) == 2:
        mc = rest.pop()[2]
    letters, steps, order = {j: "j", i: "i", "r": "k"}, {"j": tj, "i": mc, "k": kspan}, ""
    for it in rest:
        if it[0] == "pack":
            order += "p"
            continue
        letter = letters.get(it[1])
        if letter is None or letter in order.lower() or it[4] not in ("s", "par") or it[3] != steps[letter]:
            return None
        order += letter.upper() if it[4] == "par" else letter
    order += "" if i is not None else "i"  # one row: the renderer's row loop runs once
    kc = kspan if "k" in order.lower() else 0
    vector = tail[-1][4] == "vec" and tj % 16 == 0 and vector_body(plan) is not None
    if ti > 16 or tj > 64 or vector and ti * tj // VECTOR_LANES > (28 if VECTOR_LANES == 16 else 12) or kc and kc < 64:
        return None
    try:
        check_tile_order(order, bool(kc), bool(plan.panels))
    except ValueError:
        return None
    min_rows = default.min_rows if default.kind == "tiled" else 0
    return Schedule("tiled", ti=ti, tj=tj, mc=mc, kc=kc, order=order, vector=vector, min_rows=min_rows)


def to_nest(schedule, kernel: Kernel, env: dict) -> tuple:
    """The loop nest a Schedule runs (the inverse of to_schedule), for `explain`."""
    names = [v.name for v in kernel.loop_vars]
    extents = [_value(x, env) for x in kernel.shape]
    red = single_reduce(kernel)
    k_n = _value(red.extent, env) if red is not None else 0
    if schedule.kind == "loops":
        nest = [("loop", n, x, 1, "par" if d < schedule.parallel else "s") for d, (n, x) in enumerate(zip(names, extents))]
        if schedule.simd and nest:
            nest[-1] = nest[-1][:4] + ("vec",)
        if red is not None and schedule.lanes > 1:
            return tuple(nest) + (("loop", "r", k_n, schedule.lanes, "s"), ("loop", "r", schedule.lanes, 1, "vec"))
        return tuple(nest) + ((("loop", "r", k_n, 1, "s"),) if red is not None else ())
    s, two = schedule, len(kernel.shape) > 1
    batch = names[:-2] if two else names[:-1]
    m_n = extents[-2] if two else 1
    i, j = (names[-2] if two else "i"), names[-1]
    nest = [("rows",)] * s.pack_rows + [("loop", n, x, 1, "par") for n, x in zip(batch, extents)]
    block = {"j": ("loop", j, extents[-1], s.tj), "i": ("loop", i, m_n, s.mc), "k": ("loop", "r", k_n, s.kc)}
    for c in s.order if s.kc else s.order.replace("k", "").replace("K", ""):
        nest.append(("pack",) if c == "p" else block[c.lower()] + ("par" if c.isupper() else "s",))
    if s.mc != s.ti:
        nest.append(("loop", i, s.mc, s.ti, "s"))
    nest += [("loop", "r", s.kc or k_n, 1, "s"), ("loop", i, s.ti, 1, "unroll" if s.vector else "s"),
             ("loop", j, s.tj, 1, "vec" if s.vector else "s")]
    return tuple(nest if two else [it for it in nest if it[0] != "loop" or it[1] != "i"])


def show_nest(nest: tuple) -> str:
    """A nest in one line, outer to inner: dim/step for blocks, kinds as prefixes."""
    words = []
    for it in nest:
        if it[0] != "loop":
            words.append("pack" if it[0] == "pack" else "pack-rows")
            continue
        _, dim, span, step, kind = it
        loop = f"{dim}/{step}" if step > 1 else f"{dim}<{span}"
        words.append(loop if kind == "s" else f"{kind}({loop})")
    return " ".join(words)


def rewrites(naive: tuple, nest: tuple) -> list[str]:
    """The rewrites that lead from the naive nest to `nest`, in the order the stages apply them."""
    steps = [f"split {it[1]} into blocks of {it[3]}" for it in nest if it[0] == "loop" and it[3] > 1]
    canonical = [it[1] for it in naive if it[0] == "loop"]
    first = list(dict.fromkeys(it[1] for it in nest if it[0] == "loop"))  # the order dims are entered
    if first != sorted(first, key=canonical.index):
        steps.append("interchange to " + " > ".join(it[1] + (f"/{it[3]}" if it[3] > 1 else "")
                                                    for it in nest if it[0] == "loop"))
    point = [it[1] for it in nest if it[0] == "loop" and it[3] == 1]
    if "r" in point and point.index("r") < len(point) - 1:
        steps.append(f"sink r outside {', '.join(point[point.index('r') + 1:])} (register tile)")
    for it in nest:
        if it[0] == "rows":
            steps.append("pack rows: compute the row operands into a buffer before the loops")
        elif it[0] == "pack":
            steps.append("pack panels into a local buffer")
        elif it[4] != "s":
            verb = {"vec": "vectorize", "unroll": "unroll", "par": "parallelize"}[it[4]]
            steps.append(f"{verb} {it[1]}" + (f"/{it[3]}" if it[3] > 1 else ""))
    return steps


# -- the roofline cost model ------------------------------------------------------------------------
VECTOR_OPS, SCALAR_OPS = 100e9, 6e9  # per core: arithmetic per second (an FMA is 2), vectorized or not
L1, L2, L3 = 32 << 10, 1 << 20, 16 << 20  # bytes of cache per core (L3: a share)
BANDWIDTH = (300e9, 45e9, 30e9, 12e9)  # bytes per second per core from L1, L2, L3, memory (as measured)


def _bandwidth(working_set: float) -> float:
    """Bytes per second for data re-read from a working set of this many bytes."""
    return BANDWIDTH[sum(working_set > size for size in (L1, L2, L3))]
THREADS = max(1, min(os.cpu_count() or 1, int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or 64))


def estimate(program: KernelProgram, kernel: Kernel, schedule, plan, env: dict) -> float:
    """Seconds one call should take: the slower of its arithmetic (vectorized or not, threads)
    and its memory traffic (reuse from the tile shape and the loop order), plus packing work.
    Only used to rank candidates before timing, so it needs the order right, not the numbers."""
    from ..backends.cpu import _stride
    red = single_reduce(kernel)
    out = _value(numel(kernel.shape), env)
    k_n = _value(red.extent, env) if red is not None else 1
    ops = 1 + sum(isinstance(n, Apply) for n in walk(red.body if red is not None else kernel.value))
    read = sum(_value(program.buffers[b].numel, env) * 4 for b in dict.fromkeys(ld.buffer for ld in loads(kernel.value)))
    if schedule.kind == "loops":
        threads = THREADS if schedule.parallel and out * k_n >= (1 << 18) else 1
        inner = red.var if red is not None else (kernel.loop_vars[-1] if kernel.shape else None)
        body = loads(red.body) if red is not None else loads(kernel.value)
        in_order = inner is not None and all(_stride(ld.index, inner) in (0, 1) for ld in body)
        rate = VECTOR_OPS * (1.0 if red is None or schedule.lanes >= 32 else 0.5) if in_order else SCALAR_OPS
        traffic = out * k_n * 4 * (not in_order) + out * 4 + read
        return max(out * k_n * ops / rate, traffic / BANDWIDTH[3]) / threads
    s = schedule
    rows = _value(kernel.shape[-2], env) if plan.i is not None else 1
    cols, batch = _value(kernel.shape[-1], env), out // max(rows * _value(kernel.shape[-1], env), 1)
    rows_t, cols_t, col_blocks = -(-rows // s.ti) * s.ti, -(-cols // s.tj) * s.tj, -(-cols // s.tj)
    kspan, order = s.kc or k_n, s.order.lower()
    steps = batch * rows_t * cols_t * k_n  # inner-loop updates
    efficiency = min(1.0, s.ti * s.tj / 16 / 12) * (1.0 if s.vector else 0.7)  # FMA latency wants ~12 chains
    compute = steps * ops / (VECTOR_OPS * efficiency)
    panel = steps * 4 / s.ti / _bandwidth(kspan * s.tj * 4 * max(len(plan.panels), 1))  # each tile streams its panel
    row_reads = col_blocks if order.index("j") < order.index("i") else 1  # row operands re-read per column block
    rows_in = batch * rows * k_n * 4 * row_reads / _bandwidth(rows * k_n * 4 if row_reads > 1 else s.mc * kspan * 4)
    partials = 2 * out * 4 * (k_n // s.kc) / BANDWIDTH[3] if s.kc else 0.0  # outputs kept between blocks
    ops_of = lambda nodes: 1 + sum(isinstance(n, Apply) for e in nodes for n in walk(e))  # noqa: E731
    rows_work = batch * rows_t * k_n * ops_of(plan.rows) * (1 if s.pack_rows else col_blocks) / (SCALAR_OPS * 2)
    repacks = -(-rows // s.mc) if "p" in order and order.index("i") < order.index("p") else 1
    pack = batch * cols_t * k_n * ops_of(plan.panels) * repacks / (SCALAR_OPS * 2)
    parallel = batch * (col_blocks if "J" in s.order else 1) * (-(-rows // s.mc) if "I" in s.order else 1)
    threads = min(THREADS, parallel) * parallel / (-(-parallel // THREADS) * THREADS)  # with imbalance
    return (max(compute, panel, rows_in) + partials + rows_work + pack) / max(threads, 1)


# -- measuring candidates --------------------------------------------------------------------------

class Bench:
    """Variants of one kernel compiled together (two translation units built concurrently) and run
    on random inputs sized for concrete dims, plus the oracle: the kernel's plain loop body
    evaluated at chosen output positions (cpu.render_oracle), which any output size affords."""

    def __init__(self, program: KernelProgram, kernel: Kernel, schedules: list[Schedule], env: dict, seed: int):
        self.kernel, self.env, self.schedules, self.seed = kernel, env, list(schedules), seed
        self.dims = (ctypes.c_longlong * max(len(program.dims), 1))(*[env[d] for d in program.dims])
        halves = [list(range(len(schedules)))[k::2] for k in range(2)]
        oracle = render_oracle(program, kernel)
        libs = cc.load_many([_variants_source(program, kernel, schedules, half, oracle) for half in halves])
        self.calls = [None] * len(schedules)
        for lib, half in zip(libs, halves):
            for k in half:
                self.calls[k] = _c_function(lib, f"lm_variant{k}", [ctypes.c_void_p] * 2)
        self.oracle = _c_function(libs[0], "lm_oracle", [ctypes.c_void_p] * 3 + [ctypes.c_longlong, ctypes.c_void_p])
        self.arrays = _random_buffers(program, kernel, env, seed)
        self.pointers = (ctypes.c_void_p * len(program.buffers))()
        for b, arr in self.arrays.items():
            self.pointers[b] = arr.ctypes.data

    def output(self, k: int) -> np.ndarray:
        out = self.arrays[self.kernel.out]
        out.fill(np.nan)  # an element a variant fails to write shows up as a mismatch
        self.calls[k](self.pointers, self.dims)
        return out.copy()

    def validate(self, expected: np.ndarray | None = None) -> list[bool]:
        """Whether each variant is right: its output matches the oracle at sampled positions (all
        of them for small outputs; else random ones, the first and the last) -- or `expected`
        everywhere when given -- and, where the first variant is right, its output everywhere."""
        n = self.arrays[self.kernel.out].size
        rng = np.random.default_rng(self.seed)
        which = np.arange(n) if n <= 4096 or expected is not None else np.unique(np.concatenate(
            [rng.integers(0, n, 2048), np.arange(64), np.arange(n - 64, n)]))
        which = np.ascontiguousarray(which, dtype=np.int64)
        truth = np.empty(len(which), np.float32)
        if expected is not None:
            truth = expected[which]
        else:
            self.oracle(self.pointers, self.dims, which.ctypes.data, len(which), truth.ctypes.data)
        finite = np.abs(truth[np.isfinite(truth)])
        atol = RTOL * (float(finite.max()) if finite.size else 1.0) + 1e-6
        close = lambda a, b: bool(np.isclose(a, b, rtol=RTOL, atol=atol, equal_nan=True).all())  # noqa: E731
        reference, ok = None, []
        for k in range(len(self.schedules)):
            out = self.output(k)
            good = close(out[which], truth) and (reference is None or close(out, reference))
            reference = out if k == 0 and good else reference
            ok.append(good)
        return ok

    def time(self, which: list[int], budget_s: float) -> dict[int, float]:
        """Median seconds per call of each variant in `which`, in interleaved rounds (one sample of
        each contender per round, so a burst of outside load hits all alike). Validation ran each
        once already (the warm-up); after each round, variants slower than 1.5x the best so far
        drop out, and rounds stop when the budget is spent (at least 3 rounds for the leaders)."""
        samples = {k: [] for k in which}
        if not which:
            return {}
        reps = dict.fromkeys(which, 1)
        deadline = time.perf_counter() + budget_s
        alive = list(which)
        for round_ in range(25):
            for k in alive:
                start = time.perf_counter()
                for _ in range(reps[k]):
                    self.calls[k](self.pointers, self.dims)
                seconds = (time.perf_counter() - start) / reps[k]
                samples[k].append(seconds)
                reps[k] = max(1, min(1000, int(SAMPLE_S / max(seconds, 1e-7))))
            best = min(statistics.median(samples[k]) for k in alive)
            alive = [k for k in alive if statistics.median(samples[k]) <= 1.5 * best]
            if round_ >= 2 and time.perf_counter() > deadline:
                break
        return {k: statistics.median(v) for k, v in samples.items()}


def _c_function(lib, name: str, argtypes: list):
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = argtypes, None
    return fn


def _variants_source(program, kernel, schedules, which, oracle) -> str:
    return "\n\n".join([PRELUDE, oracle] + [_exported(program, kernel, f"lm_variant{k}", schedules[k]) for k in which])


def _exported(program, kernel, name: str, schedule=None) -> str:
    """The kernel's C function under `name`, callable from outside its shared object."""
    return render_kernel(program, dataclasses.replace(kernel, name=name), schedule).replace("static void", "void", 1)


def _random_buffers(program, kernel, env, seed) -> dict[int, np.ndarray]:
    """Random contents for every buffer the kernel reads (in its storage dtype) and its output."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for b in sorted({ld.buffer for ld in loads(kernel.value)} | {kernel.out}):
        buf, n = program.buffers[b], int(program.buffers[b].numel.evaluate(env))
        if buf.dtype in ("float32", "float16"):
            arrays[b] = rng.standard_normal(n).astype(buf.dtype)
        elif buf.dtype == "bfloat16":
            arrays[b] = (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else:
            info = np.iinfo(buf.dtype)
            arrays[b] = rng.integers(max(info.min, -128), min(info.max, 127) + 1, n).astype(buf.dtype)
    arrays[kernel.out] = np.zeros(int(program.buffers[kernel.out].numel.evaluate(env)), np.float32)
    return arrays


# -- the tuning cache --------------------------------------------------------------------------------
@functools.cache
def machine() -> str:
    """What a measured schedule depends on besides the kernel: CPU model and features, thread
    count, C compiler and flags."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        cpu = " ".join(line.split(":", 1)[1].strip() for line in info.splitlines()
                       if line.startswith(("model name", "flags")))[:4000]
    except OSError:
        cpu = platform.processor()
    return json.dumps([platform.machine(), cpu, THREADS, cc.compiler(), cc.FLAGS])


@functools.cache
def _code_version() -> str:
    """The search's and the CPU renderer's own source: a schedule measured with other code (a new
    candidate, a better micro-kernel) is not reused."""
    from ..backends import cpu
    return hashlib.sha256(b"".join(open(f, "rb").read() for f in (__file__, cpu.__file__))).hexdigest()


def tuning_key(fp: str, bucket: dict, seed: int) -> str:
    text = json.dumps([SEARCH_VERSION, _code_version(), fp, sorted(bucket.items()), seed, machine()])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def tuning_path(key: str):
    path = cc.cache_dir() / "tuning"
    path.mkdir(exist_ok=True)
    return path / f"{key}.json"


@dataclass
class Choice:
    """The schedule picked for a kernel (and every kernel with its structure), and why."""
    schedule: Schedule
    source: str  # "default" | "searched" | "cached" | "small" (not worth searching) | "budget" (time ran out)
    #              | "error (...)" (candidates failed to compile)
    candidates: list = field(default_factory=list)  # [description, median seconds or None (failed), is default]
    failures: int = 0  # candidates whose output did not match the oracle's
    nest: tuple = ()
    naive: tuple = ()
    seconds: float = 0.0  # spent searching this kernel

    @classmethod
    def from_json(cls, data: dict) -> Choice:
        nest = lambda items: tuple(tuple(it) for it in items)  # noqa: E731
        return cls(**{**data, "schedule": Schedule(**data["schedule"]), "source": "cached", "nest": nest(data["nest"]),
                      "naive": nest(data["naive"])})


def load_tuning(key: str, kind=Choice):
    """The cached `kind` (Choice, or Fusion) for `key`, or None."""
    try:
        return kind.from_json(json.loads(tuning_path(key).read_text()))
    except (OSError, ValueError, KeyError, TypeError):  # missing or unreadable: search again
        return None


def store_tuning(key: str, choice) -> None:
    """Atomic: write a temporary file next to the entry, then rename it over."""
    target = tuning_path(key)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, suffix=".tmp", delete=False) as f:
        json.dump(dataclasses.asdict(choice), f)
    os.replace(f.name, target)


# -- the search ------------------------------------------------------------------------------------
def search_kernel(program: KernelProgram, kernel: Kernel, env: dict, seed: int, budget_s: float) -> Choice:
    """Saturate, sample, rank, then compile, validate and time the best candidates of one kernel."""
    started = time.perf_counter()
    default, plan = default_schedule(kernel), plan_tiles(kernel)
    sp = space(kernel, env)
    tileable = {fact[1] for fact in sp.facts if fact[0] == "tileable"}
    nests = {}
    accept = lambda nest: to_schedule(nest, kernel, plan, default) is not None  # noqa: E731
    for nest in sample(saturate(sp), SAMPLES, seed, viable(kernel, tileable, ("packable",) in sp.facts), accept):
        schedule = to_schedule(nest, kernel, plan, default)
        if schedule != default:
            nests.setdefault(schedule, nest)
    schedules = [default] + pick(sorted(nests, key=lambda s: estimate(program, kernel, s, plan, env)), TIMED - 1)
    bench = Bench(program, kernel, schedules, env, seed)
    valid = bench.validate()
    times = bench.time([k for k, ok in enumerate(valid) if ok], budget_s)
    best = 0
    for k in times:
        if times[k] < times.get(best, float("inf")) * (1 - NOISE):
            best = k
    candidates = sorted(([s.describe(), times.get(k), k == 0] for k, s in enumerate(schedules)),
                        key=lambda c: float("inf") if c[1] is None else c[1])
    winner = schedules[best]
    return Choice(winner, "searched", candidates, valid.count(False), to_nest(winner, kernel, env), sp.naive,
                  round(time.perf_counter() - started, 3))


def pick(ranked: list, count: int) -> list:
    """`count` candidates from a ranked list, spread over its families: the cost model cannot
    tell apart schedules a few percent apart, so the best of each register tile and loop order
    (and of each thread / lane split for plain loops) is timed before any second of a family."""
    family = lambda s: (s.kind, s.ti, s.tj, s.order.lower(), s.vector, s.lanes)  # noqa: E731
    firsts = list({family(s): s for s in reversed(ranked)}.values())[::-1]
    firsts.sort(key=ranked.index)
    return (firsts + [s for s in ranked if s not in firsts])[:count]


def search_program(program: KernelProgram, opts: SearchOptions, fixed: dict | None = None) -> dict[str, Choice]:
    """A Choice per kernel name: structurally identical kernels share one search, each kernel
    structure is looked up in the tuning cache first, and the budget bounds the whole. `fixed`
    maps fingerprints to schedules already chosen (online-softmax kernels, by search_fusion)."""
    started = time.perf_counter()
    groups: dict[str, list[Kernel]] = {}
    for kernel in program.kernels:
        groups.setdefault(fingerprint(program, kernel), []).append(kernel)
    plans = []
    for fp, kernels in groups.items():
        kernel = kernels[0]
        used = depends_on(kernel.value) | frozenset().union(*(d.vars() for d in kernel.shape))
        bucket = {d: v for d, v in opts.dims.items() if d in used}
        work = _value(numel(kernel.shape), opts.dims) * _inner_work(kernel, opts.dims)
        plans.append((fp, kernels, bucket, work >= MIN_WORK))
    choices, todo, shown = {}, sum(big for *_, big in plans), False
    for fp, kernels, bucket, big in plans:
        kernel, env = kernels[0], opts.dims
        key = tuning_key(fp, bucket, opts.seed)
        default = default_schedule(kernel)
        choice = Choice(fixed[fp], "fused") if fp in (fixed or {}) else load_tuning(key) if big else None
        if choice is None and default.kind == "online":
            choice = Choice(default, "default")  # (no loop-nest search for these)
        if choice is None:
            left = opts.budget_s - (time.perf_counter() - started)
            if not big:
                choice = Choice(default, "small")
            elif left <= 0:
                choice = Choice(default, "budget")
            else:
                try:
                    choice = search_kernel(program, kernel, env, opts.seed, min(0.6, max(0.1, left / max(todo, 1) / 3)))
                    store_tuning(key, choice)
                except cc.CompilerError as e:  # a renderer bug must not break the compile: keep the default
                    choice = Choice(default, f"error ({str(e).splitlines()[0][:200]})")
        todo -= big
        for k in kernels:
            choices[k.name] = choice
        elapsed = time.perf_counter() - started
        if big and elapsed > PROGRESS_AFTER_S:
            shown = True
            print(f"[luminar] search: {len(plans) - todo}/{len(plans)} kernel structures, {elapsed:.1f} s "
                  f"({kernel.name}: {choice.schedule.describe()}, {choice.source})", file=sys.stderr, flush=True)
    if shown:
        print(f"[luminar] search done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return choices


# -- fusion: regions of the program as e-graph terms, each form measured -----------------------------
ONLINE_TILES = ((ONLINE_ROWS, ONLINE_KEYS), (128, ONLINE_KEYS), (32, ONLINE_KEYS), (ONLINE_ROWS, ONLINE_KEYS // 2))  # (query rows, keys) per block
INLINE_COLUMNS = 4  # the inlined form is timed only when it recomputes a region for at most this many columns


@dataclass
class Fusion:
    """One fusion region's choice: the form its value takes in the consumer kernel -- "stored" (the
    default kernels), "inlined" (the consumer's plain loops recompute it) or "online" (a single-pass
    online-softmax kernel) -- whichever measured fastest."""
    replaced: list  # names of the default kernels the fused one replaces
    kernel: str  # the fused kernel's name in the fused lowering
    unfused_s: float  # the replaced kernels' median times, summed (the stored form); 0: not timed
    candidates: list  # [description, median seconds or None, "timed" | "failed" | "pruned (...)"] of fused forms
    schedule: Schedule  # the fastest valid fused schedule
    chosen: bool  # whether it beat the stored form
    forms: list = field(default_factory=list)  # the forms the e-graph's rules reached for this region
    arena: tuple = (0, 0)  # bytes of temporaries in the shape bucket: (unfused, fused)
    source: str = "searched"  # | "cached"

    @classmethod
    def from_json(cls, data: dict) -> Fusion:
        return cls(**{**data, "schedule": Schedule(**data["schedule"]), "arena": tuple(data["arena"]), "source": "cached"})


def fusion_forms(facts: dict[int, set]) -> dict[int, list[str]]:
    """The forms each fusion region (by graph node id) can take in its consumer: an e-graph starts
    from the stored form of each (what the default lowering does) and the fuse ruleset grows the
    others, each rule guarded by a fact in `facts[node]`: "fusable" (inlining the region is legal:
    every region compiler/online.fusion_regions proposes) and "online_form" (the inlined consumer
    matches online_plan). Each region's e-class then holds its forms, one e-node each."""
    *_, relations, _, Read, fuse = _model()
    from egglog import EGraph
    egraph, reads = EGraph(), {node: Read.stored(node) for node in facts}
    for node, known in facts.items():
        egraph.register(reads[node], *[relations[name](node) for name in sorted(known)])
    egraph.run(fuse.saturate())
    return {node: sorted(str(t).split("(")[0].rsplit(".", 1)[-1] for t in egraph.extract_multiple(read, 4))
            for node, read in reads.items()}


def search_fusion(lowering, program: KernelProgram, opts: SearchOptions):
    """(program, fusions, schedules): the program lowered with every fusion region (compiler/online.py)
    whose fastest fused form beat the kernels it replaces, timed in the shape bucket (a fused kernel
    failing validation never wins), and the chosen schedule by kernel fingerprint. Decisions are
    cached like schedules."""
    from .kernels import Lowering
    from .memory import plan_memory
    from .online import absorbed_by, fusion_regions
    regions = fusion_regions(lowering)
    if not regions:
        return program, [], {}
    everything = frozenset().union(*(r for _, r in regions))
    trial = Lowering(lowering.graph, everything)
    fused = trial.run()
    by_out, default_by_out = {k.out: k for k in fused.kernels}, {k.out: k for k in program.kernels}
    consumers = {}  # region's node -> (the fused kernel, the default kernels it replaces)
    for p, region in regions:
        target = absorbed_by(trial, p)
        kernel = by_out.get(trial.buffer_of.get(target))
        if kernel is not None:
            consumers[p] = kernel, [default_by_out[lowering.buffer_of[n]] for n in sorted(region | {target})
                                    if lowering.buffer_of.get(n) in default_by_out]
    forms = fusion_forms({p: {"fusable", "online_form"} if default_schedule(k).kind == "online" else {"fusable"}
                          for p, (k, _) in consumers.items()})
    chosen, fusions, decided, schedules = set(), [], {}, {}
    arena = tuple(plan_memory(kp, opts.dims).arena_bytes for kp in (program, fused))  # (the same for every region)
    for p, region in regions:
        if p not in consumers:
            continue
        kernel, replaced = consumers[p]
        fp = fingerprint(fused, kernel)
        if fp not in decided:
            key = tuning_key("fusion " + fp, opts.dims, opts.seed)
            decided[fp] = load_tuning(key, Fusion) or _time_fusion(program, replaced, fused, kernel, forms[p], opts, key)
        decision = decided[fp]
        fusions.append(dataclasses.replace(decision, replaced=[k.name for k in replaced], kernel=kernel.name, arena=arena))
        if decision.chosen:
            chosen |= region
            schedules[fp] = decision.schedule
    if chosen and chosen != everything:
        return Lowering(lowering.graph, frozenset(chosen)).run(), fusions, schedules
    return (fused if chosen else program), fusions, schedules


def _time_fusion(program, replaced, fused, kernel, forms, opts, key) -> Fusion:
    """Time the stored form (the replaced kernels) and each fused form's schedules. The inlined form's
    plain loops compute the region's values once per output column: it is compiled only for a few
    columns (INLINE_COLUMNS), where the recomputation may cost less than storing the region."""
    from ..backends.cpu import default_loops
    schedules = [Schedule("online", ti=ti, tj=tj) for ti, tj in ONLINE_TILES] * ("online" in forms)
    pruned = []
    if "inlined" in forms:
        loops, columns = default_loops(kernel), _value(kernel.shape[-1], opts.dims) if kernel.shape else 1
        if columns <= INLINE_COLUMNS:
            schedules.append(loops)
        else:
            pruned.append([loops.describe(), None, f"pruned (recomputes the region for each of {columns} columns)"])
    if not schedules:  # nothing to compare with: the stored form stays, untimed
        decision = Fusion([], kernel.name, 0.0, pruned, default_schedule(kernel), False, forms)
        store_tuning(key, decision)
        return decision
    unfused = 0.0
    for k in replaced:
        bench = Bench(program, k, [default_schedule(k)], opts.dims, opts.seed)
        bench.validate()
        unfused += bench.time([0], 0.2)[0]
    bench = Bench(fused, kernel, schedules, opts.dims, opts.seed)
    valid = bench.validate(_unfused_output(program, replaced, fused, bench))
    times = bench.time([k for k, ok in enumerate(valid) if ok], 0.5)
    best = min(times, key=times.get, default=0)
    candidates = [[s.describe(), times.get(k), "timed" if valid[k] else "failed"] for k, s in enumerate(schedules)]
    decision = Fusion([], kernel.name, unfused, candidates + pruned, schedules[best],
                      best in times and times[best] < unfused * (1 - NOISE), forms)
    store_tuning(key, decision)
    return decision


def _unfused_output(program, replaced, fused, bench) -> np.ndarray:
    """What the fused kernel must compute: the kernels it replaces, run in order with their
    default schedules on the fused kernel's random inputs. (The fused kernel's own oracle
    recomputes the scores in several loops, where one rounding apart is inf for masked scores
    of -1e30 times a random mask.)"""
    chain = sorted(replaced, key=program.kernels.index)
    lib = cc.load("\n\n".join([PRELUDE] + [_exported(program, k, f"lm_chain{n}") for n, k in enumerate(chain)]))
    given = {fused.buffers[b].name: arr for b, arr in bench.arrays.items() if b != bench.kernel.out}
    pointers, arrays = (ctypes.c_void_p * len(program.buffers))(), {}
    for b in sorted({ld.buffer for k in chain for ld in loads(k.value)} | {k.out for k in chain}):
        buf = program.buffers[b]
        arrays[b] = given.get(buf.name, np.zeros(int(buf.numel.evaluate(bench.env)), np.float32))
        pointers[b] = arrays[b].ctypes.data
    for n in range(len(chain)):
        _c_function(lib, f"lm_chain{n}", [ctypes.c_void_p] * 2)(pointers, bench.dims)
    return arrays[chain[-1].out]


def _inner_work(kernel: Kernel, env: dict) -> int:
    work = 1
    for node in walk(kernel.value):
        if isinstance(node, Reduce):
            work *= _value(node.extent, env)
    return work


def explain(program: KernelProgram, choices: dict[str, Choice], opts: SearchOptions | None, fusions=()) -> str:
    """Each fusion choice with its times and memory; each kernel: its schedule and where it came
    from; for searched kernels the candidates with their times and the rewrites that turned the
    naive loop nest into the chosen one."""
    head = "search off: every kernel has the rule-chosen default schedule" if opts is None else \
        f"search: budget {opts.budget_s:g} s, seed {opts.seed}, shape bucket {opts.dims or '{}'}"
    lines = [f"{len(program.kernels)} kernels; {head}"]
    for f in fusions:
        verdict = f"fused into {f.kernel}" if f.chosen else "kept unfused"
        unfused = f"unfused {f.unfused_s * 1e3:.3f} ms" if f.unfused_s else "unfused (not timed: no fused form to try)"
        lines.append(f"fusion: softmax region {' + '.join(f.replaced)} (forms: {', '.join(f.forms)}): {verdict} "
                     f"[{f.source}]; {unfused}, arena {f.arena[0] / 1e6:.1f} MB -> fused {f.arena[1] / 1e6:.1f} MB")
        for desc, seconds, status in f.candidates:
            mark = " <- chosen" if f.chosen and desc == f.schedule.describe() else ""
            lines.append(f"    {f'{seconds * 1e3:9.3f} ms' if seconds is not None else f'{status:>9}'}  {desc}{mark}")
    first: dict[int, str] = {}
    for kernel in program.kernels:
        choice = choices.get(kernel.name) or Choice(default_schedule(kernel), "default")
        shape = "(" + ", ".join(map(str, kernel.shape)) + ")"
        lines.append(f"{kernel.name} {shape}: {choice.schedule.describe()} [{choice.source}]")
        if kernel.name not in choices:  # (a default made here: its id may be a freed one's)
            continue
        if id(choice) in first:
            lines.append(f"  same structure as {first[id(choice)]}")
            continue
        first[id(choice)] = kernel.name
        if choice.candidates:
            lines.append(f"  {len(choice.candidates)} candidates timed, {choice.failures} failed validation, "
                         f"{choice.seconds:.2f} s:")
            for desc, seconds, is_default in choice.candidates:
                when = "   failed" if seconds is None else f"{seconds * 1e3:9.3f} ms"
                mark = " <- chosen" if desc == choice.schedule.describe() else ""
                lines.append(f"    {when}  {desc}{' (default)' if is_default else ''}{mark}")
        if choice.nest:
            lines.append(f"  naive:  {show_nest(choice.naive)}")
            lines.append(f"  chosen: {show_nest(choice.nest)}")
            lines += [f"    - {step}" for step in rewrites(choice.naive, choice.nest)] or ["    (no rewrites)"]
    return "\n".join(lines)
