"""The GPU schedule space: what the search may do to a kernel's loop nest on an OpenCL device.

The nest language is the search's (compiler/search.py: ``loop(dim, span, step, kind, inner)``
down to ``body()``, and the ``pack`` mark, PACK); here the loop kinds mean

  "s"     a serial loop (inside a work-item)          "grid"  across work-groups
  "item"  across the work-items of a work-group       "reg"   a register tile, unrolled per work-item
  "vload4" an item loop whose work-items read their reductions' contiguous operands 4 at a time
  "run"   (the reduction r of a Split, split.py, under its grid loop) work-items each reducing a contiguous run
  "shuffle" an item loop whose work-items combine row values by sub-group shuffles (devices that have them)

and ``pack`` stages operands in local memory. Facts about a kernel (work-group extents per dim,
register-tile factors, staged reduction depths, which dims are batch dims) guard small rewrite
rules, run in stages:

  map       split a loop into work-groups of f work-items (grid over item); batch dims go to the grid
  item kinds the innermost dim's item loop reads with vector loads (where vector.py's guard holds),
            or combines by sub-group shuffles (a Rows kernel, on a device with them)
  stage     block the reduction by kt steps, staged in local memory (pack) below the block loop
  register  give each work-item g outputs of an item loop (a register tile)
  order     grid loops move out of item loops; register loops sink below the reduction (the
            tile's accumulators stay in registers across it) and below the other dim's items

`to_schedule` maps a sampled nest back to a Grid, Rows or Tiled form, refusing what the device
cannot run (work-group size, local memory); `estimate` is a rough roofline that ranks candidates
before they are timed.
"""
from __future__ import annotations

from ...compiler.analysis import plan_tiles, single_reduce, value_at, work
from ...compiler.kernels import Apply, Kernel, KernelProgram, loads, numel, walk
from ...compiler.search import PACK, Loop, Space
from ...compiler.online import online_plan
from .online import fits
from .schedules import Grid, Online, Rows, Tiled, default_schedule, hoisted_rows
from .vector import LANES, vectorizable

FLAT_GROUPS = (32, 64, 128, 256)  # work-group sizes of the Grid and Rows forms
TILE_GROUPS = {"i": (4, 8, 16), "j": (4, 8, 16, 32)}  # work-items along the rows and columns of a tile
REGISTERS = (2, 4)  # outputs per work-item along a tile's dim
STAGED = (8, 16, 32)  # reduction steps staged in local memory at a time
ONLINE_FORMS = (Online(16, 32, 4), Online(16, 32, 8), Online(32, 32, 4), Online(8, 64, 8), Online(16, 64, 16))
# a nest's order, outer to inner
RANK = {"s": 0, "grid": 1, "item": 2, "vload4": 2, "run": 2, "shuffle": 2, "block": 3, "pack": 4, "point": 5, "reg": 6}
ITEMS = ("item", "vload4", "shuffle")  # the kinds of a flat form's work-items loop


def space(kernel: Kernel, env: dict, max_group: int, subgroups: bool = False) -> Space | None:
    """The naive nest (a loop per output dim, then the reduction "r" when there is exactly one)
    and the facts guarding the rules; None for a scalar output (nothing to map). `subgroups`:
    the device has sub-group shuffles (the Rows form may combine with them)."""
    if not kernel.shape:
        return None
    names = [v.name for v in kernel.loop_vars]
    extents = [value_at(x, env) for x in kernel.shape]
    nest = [Loop(n, x, 1, "s") for n, x in zip(names, extents)]
    facts = [("extent", n, x) for n, x in zip(names, extents)]
    red, plan = single_reduce(kernel), plan_tiles(kernel)
    if red is not None:
        nest.append(Loop("r", value_at(red.extent, env), 1, "s"))
        facts.append(("extent", "r", nest[-1].span))
    facts += [("group", names[-1], f) for f in FLAT_GROUPS if f <= max_group]
    facts += [("vector", names[-1])] if vectorizable(kernel) else []
    facts += [("subgroups", names[-1])] if subgroups and hoisted_rows(kernel) else []
    if plan is not None and plan.i is not None:
        i, j = names[-2], names[-1]
        facts += [("group", i, f) for f in TILE_GROUPS["i"]] + [("group", j, f) for f in TILE_GROUPS["j"]]
        facts += [("reg", d, g) for d in (i, j) for g in REGISTERS]
        facts += [("stage", kt) for kt in STAGED if kt < nest[-1].span]
        facts += [("batch", n) for n in names[:-2]]
    return Space(tuple(nest), list(dict.fromkeys(facts)))


def rules(language):
    """The fact relations and the staged rulesets (map, item kinds, stage, register, order)."""
    from egglog import String, i64, ne, relation, rewrite, ruleset, var, vars_
    Nest = language.Nest
    fact = {"extent": relation("gpu_extent", String, i64), "group": relation("gpu_group", String, i64),
            "reg": relation("gpu_reg", String, i64), "stage": relation("gpu_stage", i64),
            "batch": relation("gpu_batch", String), "vector": relation("gpu_vector", String),
            "subgroups": relation("gpu_subgroups", String)}
    d, e, k = vars_("d e k", String)
    sp, st, sp2, st2, f = vars_("sp st sp2 st2 f", i64)
    x = var("x", Nest)
    L = Nest.loop
    map_ = ruleset(
        rewrite(L(d, sp, 1, "s", x)).to(L(d, sp, f, "grid", L(d, f, 1, "item", x)), fact["group"](d, f)),
        rewrite(L(d, sp, 1, "s", x)).to(L(d, sp, 1, "grid", x), fact["batch"](d)),
        name="gpu_map")
    item_kinds = ruleset(rewrite(L(d, sp, 1, "item", x)).to(L(d, sp, 1, "vload4", x), fact["vector"](d)),
                         rewrite(L(d, sp, 1, "item", x)).to(L(d, sp, 1, "shuffle", x), fact["subgroups"](d)),
                         name="gpu_item_kinds")
    stage = ruleset(
        rewrite(L("r", sp, 1, "s", x)).to(L("r", sp, f, "s", Nest.mark(PACK.what, L("r", f, 1, "s", x))),
                                          fact["stage"](f), fact["extent"]("r", sp)),
        name="gpu_stage")
    register = ruleset(  # (the item loop's step records its outputs per work-item: the rule fires once)
        rewrite(L(d, sp, 1, "item", x)).to(L(d, sp, f, "item", L(d, f, 1, "reg", x)), fact["reg"](d, f)),
        name="gpu_register")
    order = ruleset(
        rewrite(L(d, sp, st, "item", L(e, sp2, st2, "grid", x))).to(L(e, sp2, st2, "grid", L(d, sp, st, "item", x)),
                                                                    ne(d).to(e)),
        rewrite(L(d, sp, 1, "reg", L(e, sp2, st2, k, x))).to(L(e, sp2, st2, k, L(d, sp, 1, "reg", x)),
                                                             ne(d).to(e), ne(k).to("reg")),
        rewrite(L(d, sp, 1, "reg", Nest.mark(PACK.what, x))).to(Nest.mark(PACK.what, L(d, sp, 1, "reg", x))),
        name="gpu_order")
    return fact, [map_, item_kinds, stage, register, order]


def _rank(item) -> int:
    if item == PACK:
        return RANK["pack"]
    if item.dim == "r":
        return RANK["block"] if item.step > 1 else RANK["point"]
    return RANK[item.kind]


def viable(kernel: Kernel, sp: Space):
    """The prefix test for sampling: serial spatial loops, then grid, item, the reduction's block,
    the pack, the reduction, register loops, in that order; a dim mapped once; a dim's items
    only after its grid loop, its register loop only after its items."""
    def test(prefix, item) -> bool:
        if item != PACK and item.kind not in RANK:
            return False
        if prefix and _rank(item) < _rank(prefix[-1]):
            return False
        if item == PACK:
            return True
        kinds = {(it.dim, it.kind) for it in prefix if it != PACK}
        if (item.dim, item.kind) in kinds and item.kind != "s":
            return False
        if item.kind in (*ITEMS, "run"):
            return (item.dim, "grid") in kinds
        if item.kind == "reg":
            return (item.dim, "item") in kinds
        return True
    return test


_SHAPES: dict[int, tuple] = {}  # id(kernel) -> _shape(kernel): sampling asks to_schedule ~10^4 times per kernel


def _shape(kernel: Kernel) -> tuple:
    """(kernel, its loop names, (row, panel) operand counts of its tile plan or None, whether the
    rows form applies), computed once per kernel."""
    known = _SHAPES.get(id(kernel))
    if known is None or known[0] is not kernel:
        if len(_SHAPES) > 256:
            _SHAPES.clear()
        plan = plan_tiles(kernel)
        operands = (len(plan.rows), len(plan.panels)) if plan is not None and plan.i is not None else None
        rows = bool(hoisted_rows(kernel)) and isinstance(default_schedule(kernel), Rows)
        known = _SHAPES[id(kernel)] = (kernel, [v.name for v in kernel.loop_vars], operands, rows)
    return known


def to_schedule(nest: tuple, kernel: Kernel, max_group: int, local_bytes: int):
    """The form a nest describes, or None when it is none of them or the device cannot run it."""
    _, names, operands, rows_form = _shape(kernel)
    loops = [it for it in nest if it != PACK]
    items = {it.dim: it for it in loops if it.kind in ITEMS}
    lanes = LANES if any(it.kind == "vload4" for it in loops) else 1
    shuffles = any(it.kind == "shuffle" for it in loops)
    regs = {it.dim: it.span for it in loops if it.kind == "reg"}
    blocks = [it for it in loops if it.dim == "r" and it.step > 1]
    serial = [it.dim for it in loops if it.kind == "s" and it.dim != "r"]
    packed = PACK in nest
    if set(items) == {names[-1]} and not regs and not packed and not blocks:
        size = items[names[-1]].span
        if rows_form:
            return Rows(size, lanes, shuffles) if size & (size - 1) == 0 and (size >= 32 or not shuffles) else None
        return None if shuffles else Grid(size, lanes)
    i, j = names[-2:] if len(names) > 1 else (None, names[-1])
    # (batch dims run across work-groups whether the nest maps them to the grid or leaves them serial)
    if operands is None or set(items) != {i, j} or {i, j} & set(serial) or packed != bool(blocks) or lanes > 1 \
            or shuffles:
        return None
    tiled = Tiled(wi=items[i].span, wj=items[j].span, ri=regs.get(i, 1), rj=regs.get(j, 1),
                  kt=blocks[0].step if blocks else Tiled.kt, local=packed)
    if tiled.wi * tiled.wj > max_group or tiled.local_floats(*operands) * 4 > local_bytes:
        return None
    return tiled


def family(schedule) -> tuple:
    """Schedules the cost model cannot tell apart: one register tile and staging; a flat form (any
    work-group size) with or without vector loads, with or without sub-group shuffles."""
    if isinstance(schedule, Tiled):
        return (schedule.kind, schedule.ri, schedule.rj, schedule.local)
    return (schedule.kind, getattr(schedule, "vector", 1), getattr(schedule, "subgroups", False))


RATE, BANDWIDTH, LOCAL_BANDWIDTH = 50e9, 100e9, 400e9  # arithmetic/s, device and local memory bytes/s (rough)


def estimate(program: KernelProgram, kernel: Kernel, schedule, env: dict, units: int) -> float:
    """Seconds a call should take: the slower of arithmetic and memory traffic, where a tile's
    reuse divides the operand reads, over the compute units the work-groups keep busy. Only the
    order of candidates matters."""
    steps = value_at(work(kernel), env)
    red = single_reduce(kernel)
    ops = 1 + sum(isinstance(n, Apply) for n in walk(red.body if red is not None else kernel.value))
    read = sum(value_at(program.buffers[b].numel, env) * 4 for b in dict.fromkeys(ld.buffer for ld in loads(kernel.value)))
    out = value_at(numel(kernel.shape), env)
    if isinstance(schedule, Tiled):
        bi, bj = schedule.block
        rows, cols = value_at(kernel.shape[-2], env), value_at(kernel.shape[-1], env)
        groups = -(-rows // bi) * -(-cols // bj) * max(out // max(rows * cols, 1), 1)
        per_item = schedule.ri * schedule.rj
        compute = steps * ops / (RATE * min(1.0, per_item / 8))
        if schedule.local:
            traffic = steps * 4 * (1 / bi + 1 / bj) / BANDWIDTH + steps * 4 * (1 / schedule.ri + 1 / schedule.rj) / LOCAL_BANDWIDTH
        else:
            traffic = steps * 4 * (1 / schedule.ri + 1 / schedule.rj) / BANDWIDTH
        busy = min(units, groups) / units
        return max(compute, traffic, read / BANDWIDTH) / max(busy, 1e-3)
    groups = -(-out // schedule.local)
    if isinstance(schedule, Rows):
        groups = value_at(numel(kernel.shape[:-1]), env)
    busy = min(units, groups) / units
    return max(steps * ops / RATE, (read + steps * 4) / BANDWIDTH) / max(busy, 1e-3) * (1 + schedule.local / 1024)


def fused_schedules(kernel: Kernel, forms: list[str], max_group: int, local_bytes: int) -> tuple[list, list]:
    """The online form's blocks (query rows, staged keys, work-items per row) that the device can
    run, and a pruned row for each it cannot. The inlined form is not timed: its plain loops
    compute the region's values once per output column (every weight once per column of V)."""
    plan = online_plan(kernel) if "online" in forms else None
    if plan is None:
        return [], []
    runnable = [s for s in ONLINE_FORMS if fits(kernel, plan, s, max_group, local_bytes)]
    pruned = [[s.describe(), None, "pruned (work-group, local memory or head size)"] for s in ONLINE_FORMS if s not in runnable]
    return runnable, pruned
