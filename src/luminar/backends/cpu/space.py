"""The CPU target's schedule space: what the search may do to a kernel's loop nest here.

The nest language is the search's (compiler/search.py: ``loop(dim, span, step, kind, inner)``,
``mark(what, inner)``, ``body``); this module gives it meaning for C on a CPU. Facts about a
kernel (extents, tile factors from SIMD widths and divisors, unit strides, which dims may be
tiled, whether operands can be packed) guard small local rewrite rules, run in stages:

  tile      split a loop into blocks of a factor (whole loops, or blocks into smaller blocks)
  order     hoist a block loop out of another dim's loop (interchange); sink the reduction
            outside a small spatial loop (a register tile of accumulators)
  annotate  vectorize an innermost unit-stride loop; unroll register rows; parallelize the
            outer loops; pack the panel operands into a local buffer below a block loop;
            pack the row operands into a buffer before all loops

A split reduction is a split of ``r``: left innermost and vectorized, partial accumulators
(lanes); hoisted above the tile, reduction blocks. `to_schedule` maps a sampled nest back to a
Loops or Tiled schedule (or None: no renderer implements it), and `estimate` is the roofline cost model that ranks candidates before timing.
"""
from __future__ import annotations

import dataclasses

from ...compiler.analysis import packable_rows, plan_tiles, single_reduce, stride, value_at, vector_body, work
from ...compiler.kernels import Apply, Gather, Kernel, KernelProgram, Reduce, loads, numel, walk
from ...compiler.search import PACK, PACK_ROWS, Loop, Space
from .cc import REGISTERS, VECTOR_LANES
from .schedules import ONLINE_KEYS, ONLINE_ROWS, PARALLEL_MIN_WORK, Loops, Online, Tiled, default_schedule


def space(kernel: Kernel, env: dict) -> Space | None:
    """Dims are the kernel's loop variables plus "r" for its reduction (when it has exactly one).
    Tile factors come from SIMD widths (columns: multiples of 16 floats), register-tile heights,
    cache-sized row blocks, and lane counts for split reductions. None for an online-softmax
    kernel: its block sizes are chosen with its fusion (search.search_fusion)."""
    if isinstance(default := default_schedule(kernel), Online):
        return None
    names = [v.name for v in kernel.loop_vars]
    extents = [value_at(x, env) for x in kernel.shape]
    nest = [Loop(n, x, 1, "s") for n, x in zip(names, extents)]
    facts = [("extent", n, x) for n, x in zip(names, extents)] + [("spatial", n) for n in names]
    red, plan = single_reduce(kernel), plan_tiles(kernel)
    if red is not None:
        k_n = value_at(red.extent, env)
        nest.append(Loop("r", k_n, 1, "s"))
        facts.append(("extent", "r", k_n))
        if not any(isinstance(n, (Reduce, Gather)) for n in walk(red.body)) and \
                all(stride(ld.index, red.var) in (0, 1) for ld in loads(red.body)):
            facts += [("unit", "r"), ("tileable", "r")] + [("factor", "r", n) for n in (16, 32, 64) if 2 * n <= k_n]
    elif names and all(stride(ld.index, kernel.loop_vars[-1]) in (0, 1) for ld in loads(kernel.value)):
        facts.append(("unit", names[-1]))
    if plan is not None:
        j, m_n, n_n = names[-1], (extents[-2] if plan.i is not None else 1), extents[-1]
        facts += [("tileable", j), ("register", j), ("unit", j), ("tileable", "r")]
        facts += [("factor", j, f) for f in [f for f in (16, 32, 48, 64) if f <= n_n] or [n_n]]
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
    return Space(tuple(nest), list(dict.fromkeys(facts)), (plan, default))


def viable(kernel: Kernel, sp: Space):
    """The prefix test for `sample`: the shapes to_schedule accepts, checked as a nest grows.
    Untileable (batch) loops come first in order; a pack appears at most once; each dim is split
    at most twice, never twice by the same step; once the point loops of the tile have begun,
    the only block that may follow is a reduction split into lanes after all output loops."""
    names, packs = [v.name for v in kernel.loop_vars], ("packable",) in sp.facts
    tileable = {fact[1] for fact in sp.facts if fact[0] == "tileable"}
    batch = [n for n in names if n not in tileable]
    orders = ([n for n in names if n in tileable] + ["r"], ["r"] + [n for n in names[-2:] if n in tileable])
    limit = {names[-1]: 64, **({names[-2]: 16} if len(names) > 1 else {})}  # register tile sizes

    def test(prefix, item) -> bool:
        loops = [it for it in prefix if isinstance(it, Loop)]
        blocks = [it.dim for it in loops if it.step > 1]
        packed = any(it == PACK for it in prefix)
        if item == PACK_ROWS:  # row operands are packed before any loop
            return not prefix
        if item == PACK:  # once, below the column block, above the row-tile loop
            return not packed and names[-1] in blocks and len(set(blocks)) == len(blocks)
        dim, span, step, kind = item
        if step > 1 and (dim in blocks and kind != "s" or len(set(blocks)) < len(blocks)
                         or packed and dim in (names[-1], "r") or ("r" in blocks) != (dim == "r") and blocks):
            return False  # the row-tile loop is serial and last of the blocks; pack after j; no r blocks in tiles
        if kind == "par" and (packed or any(it.kind != "par" and it.dim != "r" for it in loops)
                              or step == 1 and any(it.step > 1 for it in loops)):
            return False  # threads split a prefix of the loops, never the tile inside blocks
        if step == 1 and dim in limit and any(it.dim == dim for it in loops) and span > limit[dim]:
            return False
        if dim in batch:
            return [it.dim for it in loops] == batch[:batch.index(dim)]
        if any(it.dim in batch for it in loops) and len({it.dim for it in loops if it.dim in batch}) < len(batch) \
                or any(it.dim == dim and it.step == step for it in loops) or sum(it.dim == dim for it in loops) > 2:
            return False
        points = [it.dim for it in loops if it.step == 1 and it.dim not in batch] + [dim] * (step == 1)
        tiled = any(b != "r" for b in blocks) or step > 1 and dim != "r"
        if not any(points == seq[:len(points)] for seq in orders[tiled:]):  # plain: dims then r; tiled: r, i, j
            return False
        if tiled and step == 1 and packs and not packed:
            return False
        started = len(points) > (step == 1)
        if step > 1 and started:
            placed = {it.dim for it in loops if it.step == 1}
            return dim == "r" and placed >= set(names) and "r" not in placed
        return True
    return test


def to_schedule(nest: tuple, kernel: Kernel, sp: Space) -> Loops | Tiled | None:
    """The schedule a nest describes, or None when no renderer implements it."""
    names, (plan, default) = [v.name for v in kernel.loop_vars], sp.context
    if nest and nest[0] == PACK_ROWS:
        tiled = _tiled_schedule(nest[1:], kernel, plan, default) if plan is not None else None
        return dataclasses.replace(tiled, pack_rows=True) if tiled is not None else None
    if any(item == PACK or item.step > 1 and item.dim != "r" for item in nest) or \
            [it.dim for it in nest if it.dim != "r"] != names or any(it.dim == "r" for it in nest[:len(names)]):
        return _tiled_schedule(nest, kernel, plan, default) if plan is not None else None
    loops, reduction = nest[:len(names)], nest[len(names):]
    kinds = [it.kind for it in loops]
    parallel = len(kinds) - len("".join("p" if k == "par" else "s" for k in kinds).lstrip("p"))
    if "par" in kinds[parallel:] or "unroll" in kinds or "vec" in kinds[:-1] or reduction and "vec" in kinds:
        return None
    lanes = reduction[0].step if len(reduction) == 2 else 1
    if any(it.kind not in ("s", "vec") for it in reduction) or len(reduction) == 2 and reduction[1].step != 1 \
            or lanes > 64:
        return None
    return Loops(parallel=parallel, lanes=lanes, simd=bool(kinds) and kinds[-1] == "vec")


def _tiled_schedule(nest, kernel, plan, default):
    """Tiled nests: batch loops, block loops (columns j/tj, rows i/mc) and a pack in some order,
    an optional row-tile loop i/ti, then r, i, j point loops (the register tile)."""
    names = [v.name for v in kernel.loop_vars]
    i = names[-2] if plan.i is not None else None
    j, batch = names[-1], names[:len(names) - (2 if i else 1)]
    head, rest = nest[:len(batch)], list(nest[len(batch):])
    if any(not isinstance(it, Loop) or it.dim != n or it.step != 1 for it, n in zip(head, batch)):
        return None
    point = ["r", i, j] if i is not None else ["r", j]
    tail, rest = rest[-len(point):], rest[:-len(point)]
    if len(tail) < len(point) or any(not isinstance(it, Loop) or it.dim != d or it.step != 1 for it, d in zip(tail, point)):
        return None
    tj, ti = tail[-1].span, (tail[1].span if i is not None else 1)
    mc = ti
    if i is not None and rest and isinstance(rest[-1], Loop) and rest[-1].dim == i and rest[-1].step == ti \
            and sum(isinstance(it, Loop) and it.dim == i for it in rest) == 2:
        mc = rest.pop().span
    letters, steps, order = {j: "j", i: "i"}, {"j": tj, "i": mc}, ""
    for it in rest:
        if it == PACK:
            order += "p"
            continue
        letter = letters.get(it.dim)
        if letter is None or letter in order.lower() or it.kind not in ("s", "par") or it.step != steps[letter]:
            return None
        order += letter.upper() if it.kind == "par" else letter
    order += "" if i is not None else "i"  # one row: the renderer's row loop runs once
    vector = tail[-1].kind == "vec" and tj % 16 == 0 and vector_body(plan) is not None
    if ti > 16 or tj > 64 or vector and ti * tj // VECTOR_LANES > REGISTERS - 4:  # (accumulators in registers)
        return None
    try:
        tiled = Tiled(ti=ti, tj=tj, mc=mc, order=order, vector=vector,
                      min_rows=default.min_rows if isinstance(default, Tiled) else 0)
    except ValueError:
        return None
    return tiled if tiled.packs_in_order(bool(plan.panels)) else None


VECTOR_OPS, SCALAR_OPS = 100e9, 6e9  # per core: arithmetic per second (an FMA is 2), vectorized or not
L1, L2, L3 = 32 << 10, 1 << 20, 16 << 20  # bytes of cache per core (L3: a share)
BANDWIDTH = (300e9, 45e9, 30e9, 12e9)  # bytes per second per core from L1, L2, L3, memory (as measured)


def _bandwidth(working_set: float) -> float:
    """Bytes per second for data re-read from a working set of this many bytes."""
    return BANDWIDTH[sum(working_set > size for size in (L1, L2, L3))]


def estimate(program: KernelProgram, kernel: Kernel, schedule: Loops | Tiled, env: dict, threads: int) -> float:
    """Seconds one call should take: the slower of its arithmetic (vectorized or not, threads)
    and its memory traffic (reuse from the tile shape and the loop order), plus packing work.
    Only used to rank candidates before timing, so it needs the order right, not the numbers."""
    red = single_reduce(kernel)
    out = value_at(numel(kernel.shape), env)
    k_n = value_at(red.extent, env) if red is not None else 1
    ops = 1 + sum(isinstance(n, Apply) for n in walk(red.body if red is not None else kernel.value))
    read = sum(value_at(program.buffers[b].numel, env) * 4 for b in dict.fromkeys(ld.buffer for ld in loads(kernel.value)))
    if isinstance(schedule, Loops):
        used = threads if schedule.parallel and value_at(work(kernel), env) >= PARALLEL_MIN_WORK else 1
        inner = red.var if red is not None else (kernel.loop_vars[-1] if kernel.shape else None)
        body = loads(red.body) if red is not None else loads(kernel.value)
        in_order = inner is not None and all(stride(ld.index, inner) in (0, 1) for ld in body)
        rate = VECTOR_OPS * (1.0 if red is None or schedule.lanes >= 32 else 0.5) if in_order else SCALAR_OPS
        traffic = out * k_n * 4 * (not in_order) + out * 4 + read
        return max(out * k_n * ops / rate, traffic / BANDWIDTH[3]) / used
    s, plan = schedule, plan_tiles(kernel)
    rows = value_at(kernel.shape[-2], env) if plan.i is not None else 1
    cols, batch = value_at(kernel.shape[-1], env), out // max(rows * value_at(kernel.shape[-1], env), 1)
    rows_t, cols_t, col_blocks = -(-rows // s.ti) * s.ti, -(-cols // s.tj) * s.tj, -(-cols // s.tj)
    order = [b.loop for b in s.blocks]
    threaded = {b.loop for b in s.blocks if b.threaded}
    steps = batch * rows_t * cols_t * k_n  # inner-loop updates
    efficiency = min(1.0, s.ti * s.tj / 16 / 12) * (1.0 if s.vector else 0.7)  # FMA latency wants ~12 chains
    compute = steps * ops / (VECTOR_OPS * efficiency)
    panel = steps * 4 / s.ti / _bandwidth(k_n * s.tj * 4 * max(len(plan.panels), 1))  # each tile streams its panel
    row_reads = col_blocks if order.index("j") < order.index("i") else 1  # row operands re-read per column block
    rows_in = batch * rows * k_n * 4 * row_reads / _bandwidth(rows * k_n * 4 if row_reads > 1 else s.mc * k_n * 4)
    ops_of = lambda nodes: 1 + sum(isinstance(n, Apply) for e in nodes for n in walk(e))  # noqa: E731
    rows_work = batch * rows_t * k_n * ops_of(plan.rows) * (1 if s.pack_rows else col_blocks) / (SCALAR_OPS * 2)
    repacks = -(-rows // s.mc) if "p" in order and order.index("i") < order.index("p") else 1
    pack = batch * cols_t * k_n * ops_of(plan.panels) * repacks / (SCALAR_OPS * 2)
    parallel = batch * (col_blocks if "j" in threaded else 1) * (-(-rows // s.mc) if "i" in threaded else 1)
    used = min(threads, parallel) * parallel / (-(-parallel // threads) * threads)  # with imbalance
    return (max(compute, panel, rows_in) + rows_work + pack) / max(used, 1)


def rules(language):
    """The fact relations and the staged rulesets (tile, order, annotate) over the nest language."""
    from egglog import String, i64, ne, relation, rewrite, ruleset, var, vars_
    Nest, Root = language.Nest, language.Root
    arguments = {"extent": (String, i64), "factor": (String, i64), "subfactor": (String, i64, i64),
                 "spatial": (String,), "unit": (String,), "tileable": (String,), "register": (String,),
                 "packable": (), "rows_packable": ()}
    fact = {name: relation(name, *types) for name, types in arguments.items()}  # each relation under its own name
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
        rewrite(L(d, sp, st, k, L(e, sp2, st2, k2, x))).to(L(d, sp, st, k, Nest.mark(PACK.what, L(e, sp2, st2, k2, x))),
                                                           fact["packable"](), st > 1),
        rewrite(Root(L(d, sp, st, k, x))).to(Root(Nest.mark(PACK_ROWS.what, L(d, sp, st, k, x))), fact["rows_packable"]()),
        name="annotate")
    return fact, [tile, order, annotate]


def family(schedule: Loops | Tiled):
    """Schedules the cost model cannot tell apart (a few percent): one register tile and loop
    order, or one thread / lane split of plain loops."""
    if isinstance(schedule, Loops):
        return (schedule.kind, schedule.lanes)
    return (schedule.kind, schedule.ti, schedule.tj, schedule.order.lower(), schedule.vector)


# the online form's blocks of (query rows, keys) timed
ONLINE_TILES = ((ONLINE_ROWS, ONLINE_KEYS), (128, ONLINE_KEYS), (32, ONLINE_KEYS), (ONLINE_ROWS, ONLINE_KEYS // 2))


def fused_schedules(kernel: Kernel, forms: list[str], env: dict) -> tuple[list, list]:
    """The online form's block sizes (and nothing pruned). The inlined form is not timed here: its
    plain loops compute the region's values once per output column (every weight once per column of V)."""
    return [Online(rows, keys) for rows, keys in ONLINE_TILES] * ("online" in forms), []
