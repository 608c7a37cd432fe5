"""A reduction split across work-groups: few outputs, each the reduction of many values (a loss, a sum).

Grid gives each output element one work-item and Rows one work-group, so a sum of 64M floats
to one scalar would run on one work-item. In the Split form each output gets `groups`
work-groups of `local` work-items: every work-item reduces a strided share of the reduction
(consecutive work-items read consecutive elements: a GPU's coalesced reads) or a contiguous run
of it (`runs`: on a CPU device, as PoCL's, strided shares re-read each cache line; the run
goes into CHAINS interleaved accumulators, as a CPU's add latency bounds one chain), each work-group combines its work-items'
values in local memory and stores its partial in a scratch buffer, then increments the
output's counter (atomic_inc on a __global int, OpenCL 1.1); the work-group that sees the last
count combines the partials, in work-group order, writes the output through the kernel's
epilogue and resets the counter to zero for the next launch. The order of every combination
is fixed by the launch's shape, so results are deterministic (within float32 rounding of the
serial order, not bitwise equal to it).

The scratch (Split.scratch words per call: the counters, then the partials) is a kernel argument
after the dims, `lm_scratch` + `lm_scratch_off`: the runtime gives each split call its own range
of one zero-filled buffer (program.py), the bench its own buffer (bench.py). A partial is made
visible before the counter with mem_fence(CLK_GLOBAL_MEM_FENCE) and read back through a volatile
pointer: the pattern OpenCL 1.2 devices (PoCL here) run correctly, though 1.2's memory model
only promises it within a work-group; calls on one in-order queue never overlap.

The CUDA target has its own split form (backends/cuda/split.py: static partials and counters,
__threadfence) and shares `applies` and the combining tree from here.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...compiler.analysis import single_reduce, value_at, work
from ...compiler.kernels import Kernel, numel
from ...compiler.search import Loop, Space
from ...ops import PRIMITIVES
from .dialect import Dialect
from .render import Emitter, _unflatten, render_float
from .schedules import Split
from .space import space

MAX_OUTPUTS = 64  # outputs a split kernel may have (a constant number: the scratch is sized at build)
MIN_STEPS = 1 << 16  # reduction length from which splitting pays (below it a work-item per output finishes sooner)
GROUPS = (16, 64, 256, 1024)  # work-groups per output the search may try
LOCALS = (32, 64, 256)  # work-items per work-group the search may try


def applies(kernel: Kernel) -> bool:
    """One reduction, few outputs (a constant number), a long or symbolic reduction."""
    red = single_reduce(kernel)
    if red is None or not numel(kernel.shape).is_const or numel(kernel.shape).value > MAX_OUTPUTS:
        return False
    return not red.extent.is_const or red.extent.value >= MIN_STEPS


def combine(prim, size: int, d: Dialect, indent: str = "    ") -> list[str]:
    """Combine lm_part[0..size) into lm_part[0], halving with barriers (every work-item calls it)."""
    return [f"{indent}{d.barrier}", f"{indent}for (int lm_s = {size // 2}; lm_s > 0; lm_s >>= 1) {{",
            f"{indent}    if (lm_lid < lm_s) lm_part[lm_lid] = {prim.c.format('lm_part[lm_lid]', 'lm_part[lm_lid + lm_s]')};",
            f"{indent}    {d.barrier}", f"{indent}}}"]


def scratch_params(d: Dialect) -> str:
    """The parameters a split kernel takes after the dims."""
    return f"{d.global_ptr} int *lm_scratch_base, const {d.index} lm_scratch_off"


@dataclass(frozen=True)
class LastGroup:
    """How a work-group makes its partial visible and learns it is the last to finish: the
    memory-model spellings, which differ between OpenCL and CUDA."""
    publish: str  # orders the partial's store before the count
    count: str  # the atomic increment of counter {0}, yielding its previous value
    acquire: str = ""  # in the last group, before it reads the other groups' partials
    partial: str = "lm_partials[{0}]"  # a read of partial {0}


OPENCL_LAST_GROUP = LastGroup("mem_fence(CLK_GLOBAL_MEM_FENCE);", "atomic_inc(&{0})")


def last_group_combines(kernel: Kernel, em: Emitter, groups: int, local: int, d: Dialect, how: LastGroup) -> list[str]:
    """After each work-item's lm_acc: the group's partial stored and counted; the last group
    combines the partials in group order, writes the output through the kernel's epilogue and
    resets the counter for the next launch."""
    red = single_reduce(kernel)
    prim, identity = PRIMITIVES[red.op], render_float(PRIMITIVES[red.op].identity)
    lines = ["    lm_part[lm_lid] = lm_acc;"] + combine(prim, local, d) + [
        "    if (lm_lid == 0) {",
        f"        lm_partials[lm_flat * {groups} + lm_block] = lm_part[0];",
        f"        {how.publish}  /* the partial is stored before the count says so */",
        f"        lm_last = {how.count.format('lm_done[lm_flat]')} == {groups - 1};", "    }", f"    {d.barrier}",
        "    if (!lm_last) return;  /* (the same for every work-item of the group: lm_last is local) */"]
    lines += [f"    {how.acquire}"] * bool(how.acquire) + [
        f"    float lm_total = {identity};",
        f"    for (int lm_b = lm_lid; lm_b < {groups}; lm_b += {local}) "
        f"lm_total = {prim.c.format('lm_total', how.partial.format(f'lm_flat * {groups} + lm_b'))};",
        "    lm_part[lm_lid] = lm_total;"] + combine(prim, local, d) + ["    if (lm_lid == 0) {"]
    out = Emitter(em.program, d, "        ", {**em.names, red: "lm_part[0]"})
    out.count = em.count
    result = out.emit(kernel.value)
    return lines + out.lines + [f"        b{kernel.out}[lm_flat] = {result};", "        lm_done[lm_flat] = 0;", "    }"]


def render_split(program, kernel: Kernel, s: Split, d: Dialect) -> list[str]:
    """The function body (after the signature, which ends with scratch_params)."""
    red = single_reduce(kernel)
    prim, ix, outputs = PRIMITIVES[red.op], d.index, numel(kernel.shape).value
    r, identity = red.var.name, render_float(prim.identity)
    g = d.global_ptr
    lines = [f"    {d.local_array} float lm_part[{s.local}];", f"    {d.local_array} int lm_last;",
             f"    const {ix} lm_flat = ({ix}){d.group_id.format(1)}, lm_block = ({ix}){d.group_id.format(0)};",
             f"    const int lm_lid = (int){d.local_id.format(0)};",
             f"    {g} volatile int *lm_done = lm_scratch_base + lm_scratch_off;  /* a counter per output */",
             f"    {g} volatile float *lm_partials = ({g} volatile float *)(lm_done + {outputs});"]
    lines += _unflatten("lm_flat", kernel.loop_vars, kernel.shape, d) if kernel.shape else []
    em = Emitter(program, d, "    ")
    em.hoist(red.body, r)
    extent, items = red.extent.render_c(), s.groups * s.local
    em.lines.append(f"    float lm_acc = {identity};")
    if s.runs:
        em.lines += _run_loop(em, red, s, d)
    else:
        em.lines.append(f"    for ({ix} {r} = lm_block * {s.local} + lm_lid; {r} < {extent}; {r} += {items}) {{")
        value = em.block(red.body)
        em.lines += [f"        lm_acc = {prim.c.format('lm_acc', value)};", "    }"]
    em.lines += last_group_combines(kernel, em, s.groups, s.local, d, OPENCL_LAST_GROUP)
    return lines + em.lines


CHAINS = 4  # a run's independent accumulators: a CPU's add latency, not its throughput, bounds one chain


def _run_loop(em, red, s: Split, d: Dialect) -> list[str]:
    """Work-item w reduces its run [w * run, (w + 1) * run) into lm_acc: CHAINS interleaved
    accumulators (step k of each group of CHAINS steps into accumulator k, the tail into the
    first), then combined into lm_acc in order."""
    prim, ix, r = PRIMITIVES[red.op], d.index, red.var.name
    extent, items, identity = red.extent.render_c(), s.groups * s.local, render_float(prim.identity)
    chains = [f"lm_chain{k}" for k in range(CHAINS)]
    lines = [f"    const {ix} lm_run = ({extent} + {items - 1}) / {items}, lm_start = (lm_block * {s.local} + lm_lid) * lm_run;",
             f"    const {ix} lm_end = min(lm_start + lm_run, ({ix})({extent}));",
             f"    float {', '.join(f'{c} = {identity}' for c in chains)};",
             f"    {ix} lm_at = lm_start;",
             f"    for (; lm_at + {CHAINS - 1} < lm_end; lm_at += {CHAINS}) {{"]
    for k, chain in enumerate(chains):
        step = em.child("        ")
        value = step.emit(red.body)
        lines += ["        {", f"            const {ix} {r} = lm_at + {k};"] + step.lines + \
            [f"            {chain} = {prim.c.format(chain, value)};", "        }"]
    tail = em.child()
    value = tail.emit(red.body)
    lines += ["    }", "    for (; lm_at < lm_end; lm_at++) {", f"        const {ix} {r} = lm_at;"] + tail.lines + \
        [f"        {chains[0]} = {prim.c.format(chains[0], value)};", "    }"]
    return lines + [f"    lm_acc = {prim.c.format('lm_acc', chain)};" for chain in chains]


def launch_split(kernel: Kernel, s: Split) -> tuple[tuple, tuple]:
    """(global, local) work sizes: `groups` work-groups along axis 0 for each output along axis 1."""
    return (s.groups * s.local, numel(kernel.shape).value), (s.local, 1)


# -- the search: the reduction loop across work-groups and their work-items ----------------------------
def rules(language):
    """A ruleset mapping the reduction loop r over `groups` work-groups of `items` work-items
    (a "grid" loop of span groups in steps of items, over "item": strided shares, or over "run":
    a contiguous run per work-item), each fact-guarded (split_space states the facts for the
    kernels split applies to)."""
    from egglog import i64, relation, rewrite, ruleset, var, vars_
    L, x = language.Nest.loop, var("x", language.Nest)
    sp, g, n = vars_("sp g n", i64)
    fact = {"split_groups": relation("gpu_split_groups", i64), "split_items": relation("gpu_split_items", i64)}
    split = ruleset(*[rewrite(L("r", sp, 1, "s", x)).to(L("r", g, n, "grid", L("r", n, 1, share, x)),
                                                        fact["split_groups"](g), fact["split_items"](n))
                      for share in ("item", "run")], name="gpu_split")
    return fact, split


def split_space(kernel: Kernel, env: dict, max_group: int) -> Space:
    """The naive nest of a split kernel (its outputs' loops, then r) with the split facts."""
    plain = space(kernel, env, max_group)
    red = single_reduce(kernel)
    naive = plain.naive if plain is not None else (Loop("r", value_at(red.extent, env), 1, "s"),)
    facts = [("split_groups", g) for g in GROUPS] + [("split_items", n) for n in LOCALS if n <= max_group]
    return Space(naive, facts + (plain.facts if plain is not None else []))


def to_split(nest: tuple, max_group: int) -> Split | None:
    """The Split form of a nest whose r runs across work-groups and work-items, its output loops
    serial; None for any other nest with r across work-groups."""
    loops = [it for it in nest if isinstance(it, Loop)]
    groups = [it.span for it in loops if it.dim == "r" and it.kind == "grid"]
    items = [it for it in loops if it.dim == "r" and it.kind in ("item", "run")]
    if len(groups) != 1 or len(items) != 1 or any(it.kind != "s" for it in loops if it.dim != "r"):
        return None
    n = items[0].span
    return Split(groups[0], n, items[0].kind == "run") if n <= max_group and n & (n - 1) == 0 else None


def estimate(kernel: Kernel, s: Split, env: dict, units: int, rate: float) -> float:
    """Seconds: the reduction's steps over the work-groups' share of the compute units, plus the
    combining of the partials (one step each) by one work-group."""
    outputs = numel(kernel.shape).value
    busy = min(units, s.groups * outputs) / units
    return value_at(work(kernel), env) / rate / busy + s.groups * outputs / rate * s.local
