"""Search: pick each kernel's schedule by rewriting its loop nest in an e-graph and timing candidates.

The kernel IR says what a kernel computes; a schedule (the target's type) says how its loops
run. Without search every kernel gets its target's default schedule (fused kernels: the one its
rule gives, see default_fusion). With search, for a target
(compiler/target.py) and each shape bucket the program will meet:

1. Kernels are deduplicated by their canonical form (kernels.canonical_form without load
   offsets), so a model's repeated layers are searched once.
2. A kernel's loop nest becomes an egglog term of the nest language below:
   ``Root(loop(dim, span, step, kind, inner))`` down to ``body()``, one loop per output dim plus
   the reduction ``r``, with ``pack`` / ``pack_rows`` marks. The target states facts about the
   kernel and guarded rewrite rules over that language; they run in stages, one iteration at a
   time, within a node and a time limit.
3. Many distinct terms are sampled from the saturated e-graph (seeded, backtracking out of
   shapes the target cannot run), each mapped back to a schedule by the target and ranked by its
   cost estimate; the best of each family plus the default go to the target's bench, which
   builds them in one batch, validates them (at sampled output positions against the plain loop
   body, everywhere against the default) and times the valid ones. A failing candidate never
   wins; the fastest does, by more than NOISE.
4. Results go to a tuning cache on disk keyed by kernel structure, shape bucket, seed, the
   target's machine and the source of the compiler and the target (tuning_key), written
   atomically. The whole compile's search has a time budget; kernels left when it is spent keep
   the default (and are not cached).

Shape buckets: `search_dims` gives each symbolic dim one value or several (the decode step s = 1
and the prefill s = 128); every combination is a bucket, each kernel is searched at each bucket
whose values it reads, and the built program runs each kernel with the schedule of the bucket
nearest its run-time dims. Fusion is decided once, at the largest bucket.

Before the schedules, the fusion choice (search_fusion). Each softmax region the lowering would
give a buffer (compiler/online.py) is an e-graph term ``Read("stored", node)``: how its consumer gets
its value. The fuse ruleset grows the other forms, each rule guarded by a fact: fuse (stored ->
inlined, where inlining is legal), un-fuse (inlined -> stored) and the online-softmax recurrence
(inlined -> online, where the consumer's weighted sum of exponentials matches online_plan). The
target proposes schedules for each fused form; the fused kernel is validated against the unfused
kernels run on the same random inputs, and kept only if it beats the kernels it replaces as they
would run: each with its searched schedule (searched first, and cached for the schedule search).
Without search the same forms are reached, and the target decides by rule (default_fusion,
Target.default_fusion): the CPU takes the online form wherever a softmax region reaches it.

The candidate set is a pure function of the kernel, the bucket and the seed; which candidate
wins depends on measurements, and is then cached, so later compiles are deterministic and fast.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import DimensionError, UnsupportedError, ValueDomainError
from .analysis import value_at, work
from .kernels import Kernel, KernelProgram, canonical_form, depends_on, loads
from .target import CompilerError, Target, cache_dir

DEFAULT_BUDGET_S = 30.0  # search=True: seconds for the whole compile's search
DEFAULT_DIM = 128  # a symbolic dim's value in the shape bucket searched, unless search_dims says
MIN_WORK = 1 << 16  # kernels with fewer inner iterations than this keep the default (not worth timing)
NODE_LIMIT, SATURATE_S = 20_000, 1.0  # e-graph rows and seconds; saturation stops beyond either
SAMPLES, TIMED = 400, 8  # terms sampled from the e-graph; candidates compiled and timed per kernel
NOISE = 0.03  # a later candidate must be this much faster to win
PROGRESS_AFTER_S = 2.0  # a search running longer than this reports each kernel on stderr


# -- options --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchOptions:
    budget_s: float
    buckets: tuple  # dim values searched: one dict per bucket, the largest (prefill) last
    seed: int
    dims: dict  # the largest bucket: where fusion is decided


def options(search=None, search_dims=None, seed=0, dims=()) -> SearchOptions | None:
    """Validate compile options; None when search is off. `search` is False/True/seconds; when
    None, the environment variable LUMINAR_SEARCH decides (0/1/seconds). `search_dims` maps a
    symbolic dim to a value or a list of values (default 128)."""
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
    values = {d: [DEFAULT_DIM] for d in dims}
    for name, given in (search_dims or {}).items():
        if name not in values:
            raise DimensionError(f"compile option search_dims: {name!r} is not a symbolic dim of this graph "
                                 f"(its dims: {sorted(values)})")
        given = list(given) if isinstance(given, (list, tuple)) else [given]
        if not given or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in given):
            raise DimensionError(f"compile option search_dims[{name!r}] = {given!r}: expected an int >= 1 or a "
                                 f"non-empty list of them")
        values[name] = sorted({int(v) for v in given})
    buckets = tuple(dict(zip(values, combo)) for combo in itertools.product(*values.values()))
    return None if budget is None else SearchOptions(budget, buckets, int(seed), buckets[-1])


def nearest_bucket(opts: SearchOptions | None, env: dict) -> int:
    """The index of the bucket nearest these dim values: the smallest sum of |log2(dim / bucket
    value)| (the first of equals; 0 without search)."""
    distance = lambda k: sum(abs(math.log2(env[d] / v)) for d, v in opts.buckets[k].items())  # noqa: E731
    return min(range(len(opts.buckets)), key=distance) if opts and len(opts.buckets) > 1 else 0


def fingerprint(program: KernelProgram, kernel: Kernel) -> str:
    """The kernel's structure as text: its canonical form without load offsets, with the storage
    dtype of each buffer (layer k of a stacked cache reads at another offset but schedules the same)."""
    canon, ids = canonical_form(kernel, offsets=False)
    return repr((tuple(map(str, canon.shape)), canon.value, [program.buffers[b].dtype for b in ids]))


# -- the nest language: loop nests as terms ---------------------------------------------------------
class Loop(NamedTuple):
    """One loop of a nest: `dim` (a loop variable, or "r" for the reduction) over `span`
    iterations in steps of `step` (a block loop when > 1); `kind` is how it runs, in the target's
    words ("s" serial; the CPU's "vec", "unroll", "par")."""
    dim: str
    span: int
    step: int
    kind: str


class Mark(NamedTuple):
    """A nest item that is not a loop: where the target packs operands into a buffer."""
    what: str


PACK, PACK_ROWS = Mark("pack"), Mark("rows")  # panels into a local buffer here; row operands before all loops


@dataclass
class Space:
    """What the search knows about one kernel: its naive loop nest (Loop items, outer to inner),
    the facts (relation name, *arguments) guarding the target's rules, and the target's own
    analysis of the kernel, handed back to viable and to_schedule (which run per sampled nest)."""
    naive: tuple
    facts: list
    context: object = None


class Language(NamedTuple):
    Nest: type
    Root: type
    Read: type
    fuse: object  # the fusion ruleset
    fusion_facts: dict


@functools.cache
def language() -> Language:
    """The egglog sorts of the nest language and of fusion forms (built once, on first use:
    importing egglog takes ~0.3 s, which a compile without search should not pay)."""
    try:
        from egglog import Expr, StringLike, i64, i64Like, relation, rewrite, ruleset, var
    except ImportError:
        raise UnsupportedError("compile(..., search=...) needs the egglog package: pip install egglog==13.2.0") from None

    class Nest(Expr):
        @classmethod
        def body(cls) -> Nest: ...  # noqa: F821 - one step of the computation (an element, a reduction step)

        @classmethod
        def loop(cls, dim: StringLike, span: i64Like, step: i64Like, kind: StringLike, inner: Nest) -> Nest: ...  # noqa: F821

        @classmethod
        def mark(cls, what: StringLike, inner: Nest) -> Nest: ...  # noqa: F821 - a Mark (PACK, PACK_ROWS) here

    class Root(Expr):
        def __init__(self, nest: Nest) -> None: ...

    # How a consumer kernel gets a fusion region's value (the region by graph node id), in `form`:
    # "stored" (the region's own kernels write a buffer), "inlined" (computed inside the consumer's
    # loops) or "online" (inlined, the consumer's weighted sum as the online-softmax recurrence).
    class Read(Expr):
        def __init__(self, form: StringLike, node: i64Like) -> None: ...

    facts = {"fusable": relation("fusable", i64), "online_form": relation("online_form", i64)}
    node = var("node", i64)
    fuse = ruleset(
        rewrite(Read("stored", node)).to(Read("inlined", node), facts["fusable"](node)),  # fuse into the consumer
        rewrite(Read("inlined", node)).to(Read("stored", node)),  # un-fuse: always legal
        # max-reduce / exp / sum-reduce weighting a sum -> running max with a rescaled running sum
        rewrite(Read("inlined", node)).to(Read("online", node), facts["online_form"](node)),
        name="fuse")
    return Language(Nest, Root, Read, fuse, facts)


@functools.cache
def _rules(target: Target):
    return target.rules(language())


def saturate(target: Target, sp: Space):
    """An e-graph holding the naive nest and every nest the target's staged rulesets reach from it."""
    from egglog import EGraph
    lang = language()
    relations, stages = _rules(target)
    egraph = EGraph()
    for name, *args in sp.facts:
        egraph.register(relations[name](*args))
    term = lang.Nest.body()
    for loop in reversed(sp.naive):
        term = lang.Nest.loop(loop.dim, loop.span, loop.step, loop.kind, term)
    egraph.register(lang.Root(term))
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
    rejects and out of whole nests `complete` rejects (those the target cannot run).

    This reads egglog's internal frozen view (every e-class with its e-nodes): egglog 13.2's
    public FrozenEGraph offers no way to enumerate e-classes, and extract_multiple returns one
    term per e-node of the root class only."""
    raw = egraph._egraph
    classes, root = {}, None
    for name, fn in raw.freeze().functions.items():
        for row in fn.rows:
            kind = name.rsplit("_", 1)[-1] if "Nest_" in name else "root" if name.endswith("Root___init__") else None
            if kind == "loop":
                dim, span, step, how, inner = row.inputs
                node = (Loop(raw.value_to_string(dim), raw.value_to_i64(span), raw.value_to_i64(step),
                             raw.value_to_string(how)), inner)
            elif kind == "mark":
                node = (Mark(raw.value_to_string(row.inputs[0])), row.inputs[1])
            elif kind == "body":
                node = ("body", None)
            elif kind == "root":
                node, root = ("root", row.inputs[0]), row.output
            else:
                continue
            classes.setdefault(row.output, []).append(node)
    for nodes in classes.values():  # an order that depends on the graph's content only
        nodes.sort(key=lambda n: (str(n[0]), str(n[1])))
    rng = np.random.default_rng(seed)
    visits = [0]

    def draw(cls, prefix):
        for k in rng.permutation(len(classes[cls])):
            visits[0] += 1
            item, child = classes[cls][k]
            if item == "body":
                if complete(prefix):
                    return prefix
                continue
            item = None if item == "root" else item
            if visits[0] > 5000 or item is not None and not viable(prefix, item):
                continue
            found = draw(child, prefix + ((item,) if item else ()))
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


def show_nest(nest: tuple) -> str:
    """A nest in one line, outer to inner: dim/step for blocks, kinds as prefixes."""
    words = []
    for it in nest:
        if not isinstance(it, Loop):
            words.append("pack" if it == PACK else "pack-rows")
            continue
        loop = f"{it.dim}/{it.step}" if it.step > 1 else f"{it.dim}<{it.span}"
        words.append(loop if it.kind == "s" else f"{it.kind}({loop})")
    return " ".join(words)


def rewrites(naive: tuple, nest: tuple) -> list[str]:
    """The rewrites that lead from the naive nest to `nest`, in the order the stages apply them."""
    loops = [it for it in nest if isinstance(it, Loop)]
    steps = [f"split {it.dim} into blocks of {it.step}" for it in loops if it.step > 1]
    canonical = [it.dim for it in naive]
    first = list(dict.fromkeys(it.dim for it in loops))  # the order dims are entered
    if first != sorted(first, key=canonical.index):
        steps.append("interchange to " + " > ".join(it.dim + (f"/{it.step}" if it.step > 1 else "") for it in loops))
    point = [it.dim for it in loops if it.step == 1]
    if "r" in point and point.index("r") < len(point) - 1:
        steps.append(f"sink r outside {', '.join(point[point.index('r') + 1:])} (register tile)")
    for it in nest:
        if it == PACK_ROWS:
            steps.append("pack rows: compute the row operands into a buffer before the loops")
        elif it == PACK:
            steps.append("pack panels into a local buffer")
        elif it.kind != "s":
            verb = {"vec": "vectorize", "unroll": "unroll", "par": "parallelize"}.get(it.kind, it.kind)
            steps.append(f"{verb} {it.dim}" + (f"/{it.step}" if it.step > 1 else ""))
    return steps


def _nest_from_json(items) -> tuple:
    return tuple(Loop(*it) if len(it) == 4 else Mark(*it) for it in items)


# -- the tuning cache --------------------------------------------------------------------------------
@functools.cache
def code_version(target: Target) -> str:
    """The source of the compiler package and of the target's: a decision measured with other
    code (a new candidate, a better micro-kernel, another lowering) is not reused."""
    files = sorted(Path(__file__).parent.glob("*.py")) + list(target.sources())
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


def tuning_key(target: Target, fp: str, bucket: dict, seed: int) -> str:
    text = json.dumps([target.name, code_version(target), fp, sorted(bucket.items()), seed,
                       target.machine()])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def tuning_path(key: str) -> Path:
    path = cache_dir() / "tuning"
    path.mkdir(exist_ok=True)
    return path / f"{key}.json"


@dataclass
class Choice:
    """The schedule picked for a kernel (and every kernel with its structure) in one bucket, and why."""
    schedule: object  # the target's schedule
    source: str  # "default" | "searched" | "cached" | "small" (not worth searching) | "budget" (time ran out)
    #              | "fused" (an online kernel, by search_fusion or default_fusion) | "error (...)" (candidates failed to build)
    candidates: list = field(default_factory=list)  # [description, median seconds or None (failed), is default]
    failures: int = 0  # candidates whose output did not match the oracle's
    nest: tuple = ()
    naive: tuple = ()
    seconds: float = 0.0  # spent searching this kernel

    @classmethod
    def from_json(cls, target: Target, data: dict) -> Choice:
        return cls(**{**data, "schedule": target.schedule_from_json(data["schedule"]), "source": "cached",
                      "nest": _nest_from_json(data["nest"]), "naive": _nest_from_json(data["naive"])})


def load_tuning(target: Target, key: str, kind=Choice):
    """The cached `kind` (Choice, or Fusion) for `key`, or None."""
    try:
        return kind.from_json(target, json.loads(tuning_path(key).read_text()))
    except (OSError, ValueError, KeyError, TypeError):  # missing or unreadable: search again
        return None


def store_tuning(target: Target, key: str, choice) -> None:
    """Atomic: write a temporary file next to the entry, then rename it over."""
    path = tuning_path(key)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
        json.dump({**dataclasses.asdict(choice), "schedule": target.schedule_to_json(choice.schedule)}, f)
    os.replace(f.name, path)


# -- the search ------------------------------------------------------------------------------------
def search_kernel(target: Target, program: KernelProgram, kernel: Kernel, env: dict, seed: int,
                  budget_s: float) -> Choice:
    """Saturate, sample, rank, then build, validate and time the best candidates of one kernel."""
    started = time.perf_counter()
    default, sp = target.default_schedule(kernel), target.space(kernel, env)
    if sp is None:
        return Choice(default, "default")
    nests = {}
    accept = lambda nest: target.to_schedule(nest, kernel, sp) is not None  # noqa: E731
    for nest in sample(saturate(target, sp), SAMPLES, seed, target.viable(kernel, sp), accept):
        nests.setdefault(target.to_schedule(nest, kernel, sp), nest)  # (the nest explain shows)
    ranked = sorted((s for s in nests if s != default), key=lambda s: target.estimate(program, kernel, s, env))
    schedules = [default] + pick(target, ranked, TIMED - 1)
    bench = target.bench(program, kernel, schedules, env, seed)
    valid = bench.validate()
    times = bench.time([k for k, ok in enumerate(valid) if ok], budget_s)
    best = 0
    for k in times:
        if times[k] < times.get(best, float("inf")) * (1 - NOISE):
            best = k
    candidates = sorted(([s.describe(), times.get(k), k == 0] for k, s in enumerate(schedules)),
                        key=lambda c: float("inf") if c[1] is None else c[1])
    winner = schedules[best]
    return Choice(winner, "searched", candidates, valid.count(False), nests.get(winner, ()), sp.naive,
                  round(time.perf_counter() - started, 3))


def pick(target: Target, ranked: list, count: int) -> list:
    """`count` candidates from a ranked list, spread over the target's families: the cost model
    cannot tell apart schedules a few percent apart, so the best of each family is timed before
    any second of one."""
    firsts = sorted({target.family(s): s for s in reversed(ranked)}.values(), key=ranked.index)
    return (firsts + [s for s in ranked if s not in firsts])[:count]


def search_program(target: Target, program: KernelProgram, opts: SearchOptions,
                   fixed: dict | None = None) -> dict[str, list[Choice]]:
    """Per kernel name, a Choice per bucket of `opts`: one search per kernel structure and per
    values of the dims it reads (repeated layers, and buckets differing only in dims a kernel
    does not read, share one), each looked up in the tuning cache first; the budget bounds the
    whole. `fixed` maps fingerprints to schedules already chosen (online kernels, by search_fusion)."""
    started, groups, jobs = time.perf_counter(), {}, {}
    for kernel in program.kernels:
        groups.setdefault(fingerprint(program, kernel), []).append(kernel)
    for fp, kernels in groups.items():  # job (structure, its dims' values) -> a bucket with those values
        for bucket in opts.buckets:
            jobs.setdefault((fp, _reads(kernels[0], bucket)), bucket)
    big = {job: value_at(work(groups[job[0]][0]), env) >= MIN_WORK for job, env in jobs.items()}
    todo, decided = sum(big.values()), {}
    for (fp, values), env in jobs.items():
        kernel, default = groups[fp][0], target.default_schedule(groups[fp][0])
        key = tuning_key(target, fp, dict(values), opts.seed)
        choice = Choice(fixed[fp], "fused") if fp in (fixed or {}) else load_tuning(target, key) if big[fp, values] \
            else Choice(default, "small")
        left = opts.budget_s - (time.perf_counter() - started)
        if choice is None and left <= 0:
            choice = Choice(default, "budget")
        elif choice is None:
            try:
                choice = search_kernel(target, program, kernel, env, opts.seed, min(0.6, max(0.1, left / max(todo, 1) / 3)))
                store_tuning(target, key, choice)
            except CompilerError as e:  # a renderer bug must not break the compile: keep the default
                choice = Choice(default, f"error ({str(e).splitlines()[0][:200]})")
        todo -= big[fp, values]
        decided[fp, values] = choice
        if big[fp, values] and time.perf_counter() - started > PROGRESS_AFTER_S:
            print(f"[luminar] search: {kernel.name} at {dict(values) or 'fixed dims'}: {choice.schedule.describe()}, "
                  f"{choice.source} ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    return {k.name: [decided[fp, _reads(k, b)] for b in opts.buckets] for fp, kernels in groups.items() for k in kernels}


def _reads(kernel: Kernel, bucket: dict) -> tuple:
    """The bucket's values of the dims `kernel` reads."""
    used = depends_on(kernel.value) | frozenset().union(*(d.vars() for d in kernel.shape))
    return tuple(sorted((d, v) for d, v in bucket.items() if d in used))


# -- fusion: regions of the program as e-graph terms, each form measured -----------------------------
@dataclass
class Fusion:
    """One fusion region's choice: the form its value takes in the consumer kernel -- "stored" (the
    default kernels), "inlined" (the consumer's plain loops recompute it) or "online" (a single-pass
    online-softmax kernel) -- whichever measured fastest."""
    replaced: list  # names of the default kernels the fused one replaces
    kernel: str  # the fused kernel's name in the fused lowering
    unfused_s: float  # the replaced kernels' median times with their searched schedules, summed; 0: not timed
    candidates: list  # [description, median seconds or None, "timed" | "failed" | "pruned (...)"] of fused forms
    schedule: object  # the fastest valid fused schedule
    chosen: bool  # whether it beat the stored form
    forms: list = field(default_factory=list)  # the forms the e-graph's rules reached for this region
    stored: list = field(default_factory=list)  # [schedule, its Choice's source] per replaced kernel, as timed
    source: str = "searched"  # | "cached"

    @classmethod
    def from_json(cls, target: Target, data: dict) -> Fusion:
        return cls(**{**data, "schedule": target.schedule_from_json(data["schedule"]), "source": "cached"})


def fusion_forms(facts: dict[int, set]) -> dict[int, list[str]]:
    """The forms each fusion region (by graph node id) can take in its consumer: an e-graph starts
    from the stored form of each (what the default lowering does) and the fuse ruleset grows the
    others, each rule guarded by a fact in `facts[node]`: "fusable" (inlining the region is legal:
    every region compiler/online.fusion_regions proposes) and "online_form" (the inlined consumer
    matches online_plan). Each region's e-class then holds its forms, one e-node each."""
    lang = language()
    from egglog import EGraph
    egraph, reads = EGraph(), {node: lang.Read("stored", node) for node in facts}
    for node, known in facts.items():
        egraph.register(reads[node], *[lang.fusion_facts[name](node) for name in sorted(known)])
    egraph.run(lang.fuse.saturate())
    return {node: sorted(str(t).split('"')[1] for t in egraph.extract_multiple(read, 4))  # Read("form", node)
            for node, read in reads.items()}


def _fusion_sites(lowering, regions: list, program: KernelProgram | None = None):
    """(the lowering with all of `regions` (compiler/online.fusion_regions) inlined, its consumers:
    region node -> (the fused kernel, the kernels of `program` -- the default lowering -- it
    replaces, the region), the forms each region reached, every region's nodes)."""
    from .kernels import Lowering
    from .online import absorbed_by, online_plan
    everything = frozenset().union(*(r for _, r in regions))
    trial = Lowering(lowering.graph, everything)
    fused = trial.run()
    by_out, default_by_out = {k.out: k for k in fused.kernels}, {k.out: k for k in program.kernels} if program else {}
    consumers = {}
    for p, region in regions:
        target_node = absorbed_by(trial, p)
        kernel = by_out.get(trial.buffer_of.get(target_node))
        if kernel is not None:
            consumers[p] = kernel, [default_by_out[lowering.buffer_of[n]] for n in sorted(region | {target_node})
                                    if lowering.buffer_of.get(n) in default_by_out], region
    forms = fusion_forms({p: {"fusable", "online_form"} if online_plan(k) is not None else {"fusable"}
                          for p, (k, _, _) in consumers.items()})
    return fused, consumers, forms, everything


def _lowered_with(lowering, fused: KernelProgram, chosen: set, everything) -> KernelProgram:
    """The program with the `chosen` regions fused (`fused`: with all of `everything`)."""
    from .kernels import Lowering
    if chosen == everything:
        return fused
    return Lowering(lowering.graph, frozenset(chosen)).run() if chosen else lowering.run()


def search_fusion(target: Target, lowering, program: KernelProgram, opts: SearchOptions):
    """(program, fusions, schedules): the program lowered with every fusion region (compiler/online.py)
    whose fastest fused form beat the kernels it replaces, timed in the largest shape bucket (a
    fused kernel failing validation never wins), and the chosen schedule by kernel fingerprint.
    Decisions are cached like schedules."""
    from .online import fusion_regions
    regions = fusion_regions(lowering)
    if not regions:
        return program, [], {}
    fused, consumers, forms, everything = _fusion_sites(lowering, regions, program)
    chosen, fusions, decided, schedules = set(), [], {}, {}
    for p, (kernel, replaced, region) in consumers.items():  # (in the order of `regions`)
        fp = fingerprint(fused, kernel)
        if fp not in decided:
            key = tuning_key(target, "fusion " + fp, opts.dims, opts.seed)
            decided[fp] = load_tuning(target, key, Fusion) or \
                _time_fusion(target, program, replaced, fused, kernel, forms[p], opts, key)
        decision = decided[fp]
        fusions.append(dataclasses.replace(decision, replaced=[k.name for k in replaced], kernel=kernel.name))
        if decision.chosen:
            chosen |= region
            schedules[fp] = decision.schedule
    return (_lowered_with(lowering, fused, chosen, everything) if chosen else program), fusions, schedules


def default_fusion(target: Target, lowering):
    """Without search: (the graph lowered with the fusion regions the target fuses by rule --
    Target.default_fusion --, the fused kernels' Choices by name, as search_program gives). Only
    regions holding a max (softmax) are tried: the online form needs one; the default lowering
    runs only when some region stays unfused."""
    from .online import fusion_regions
    ops = {n.id: n.op for n in lowering.graph.nodes}
    regions = [(p, r) for p, r in fusion_regions(lowering) if any(ops[n] == "max_reduce" for n in r)]
    if not regions:
        return lowering.run(), {}
    fused, consumers, forms, everything = _fusion_sites(lowering, regions)
    chosen, picked = set(), []  # [(fused kernel, its schedule)]
    for p, (kernel, _, region) in consumers.items():
        schedule = target.default_fusion(kernel, forms[p])
        if schedule is not None:
            chosen |= region
            picked.append((kernel, schedule))
    program = _lowered_with(lowering, fused, chosen, everything)
    if program is fused:
        return program, {kernel.name: [Choice(schedule, "fused")] for kernel, schedule in picked}
    by_fingerprint = {fingerprint(fused, kernel): schedule for kernel, schedule in picked}  # (relowered: new names)
    return program, {k.name: [Choice(by_fingerprint[fp], "fused")] for k in program.kernels
                     if (fp := fingerprint(program, k)) in by_fingerprint}


def _time_fusion(target, program, replaced, fused, kernel, forms, opts, key) -> Fusion:
    """Time the stored form -- the replaced kernels with the schedules they would run with: the
    searched ones (search_program, whose tuning cache the program's own search then reads) -- and
    the target's schedules for each fused form."""
    schedules, pruned = target.fused_schedules(kernel, forms, opts.dims)
    if not schedules:  # nothing to compare with: the stored form stays, untimed (and uncached: nothing was measured)
        return Fusion([], kernel.name, 0.0, pruned, target.default_schedule(kernel), False, forms)
    alone = search_program(target, dataclasses.replace(program, kernels=replaced),
                           dataclasses.replace(opts, buckets=(opts.dims,)))
    unfused, stored = 0.0, [[alone[k.name][0].schedule.describe(), alone[k.name][0].source] for k in replaced]
    for k in replaced:
        bench = target.bench(program, k, [alone[k.name][0].schedule], opts.dims, opts.seed)
        bench.validate()
        unfused += bench.time([0], 0.2)[0]
    bench = target.bench(fused, kernel, schedules, opts.dims, opts.seed)
    valid = bench.validate(_unfused_output(target, program, replaced, fused, bench.arrays, kernel, opts.dims))
    times = bench.time([k for k, ok in enumerate(valid) if ok], 0.5)
    best = min(times, key=times.get, default=0)
    candidates = [[s.describe(), times.get(k), "timed" if valid[k] else "failed"] for k, s in enumerate(schedules)]
    decision = Fusion([], kernel.name, unfused, candidates + pruned, schedules[best],
                      best in times and times[best] < unfused * (1 - NOISE), forms, stored)
    store_tuning(target, key, decision)
    return decision


def _unfused_output(target, program, replaced, fused, given, kernel, env) -> np.ndarray:
    """What the fused kernel must compute: the kernels it replaces, run in order with their
    default schedules on the fused kernel's random inputs (`given`, by fused buffer id). (The
    fused kernel's own oracle recomputes the scores in several loops, where one rounding apart is
    inf for masked scores of -1e30 times a random mask.)"""
    chain = sorted(replaced, key=program.kernels.index)
    by_name = {fused.buffers[b].name: arr for b, arr in given.items() if b != kernel.out}
    arrays = {}
    for b in sorted({ld.buffer for k in chain for ld in loads(k.value)} | {k.out for k in chain}):
        buf = program.buffers[b]
        arrays[b] = by_name.get(buf.name, np.zeros(int(buf.numel.evaluate(env)), np.float32))
    target.run_chain(program, chain, arrays, env)
    return arrays[chain[-1].out]


def explain(target: Target, program: KernelProgram, choices: dict[str, list[Choice]], opts: SearchOptions | None,
            fusions=()) -> str:
    """Each fusion choice with its times and memory; each kernel: its schedule (per shape bucket
    where they differ) and where it came from; for searched kernels the candidates with their
    times and the rewrites that turned the naive loop nest into the chosen one."""
    head = "search off: every kernel has the rule-chosen default schedule" if opts is None else \
        f"search: budget {opts.budget_s:g} s, seed {opts.seed}, shape buckets {list(opts.buckets)}"
    lines = [f"{len(program.kernels)} kernels; {head}"]
    for f in fusions:
        verdict = f"fused into {f.kernel}" if f.chosen else "kept unfused"
        unfused = f"unfused {f.unfused_s * 1e3:.3f} ms" if f.unfused_s else "unfused (not timed: no fused form to try)"
        lines.append(f"fusion: softmax region {' + '.join(f.replaced)} (forms: {', '.join(f.forms)}): {verdict} "
                     f"[{f.source}]; {unfused}")
        lines += [f"    stored form: {name}: {desc} [{source}]" for name, (desc, source) in zip(f.replaced, f.stored)]
        for desc, seconds, status in f.candidates:
            mark = " <- chosen" if f.chosen and desc == f.schedule.describe() else ""
            lines.append(f"    {f'{seconds * 1e3:9.3f} ms' if seconds is not None else f'{status:>9}'}  {desc}{mark}")
    first: dict[int, str] = {}
    for kernel in program.kernels:
        per = choices.get(kernel.name) or [Choice(target.default_schedule(kernel), "default")]
        shape = "(" + ", ".join(map(str, kernel.shape)) + ")"
        if len({c.schedule for c in per}) == 1:
            lines.append(f"{kernel.name} {shape}: {per[0].schedule.describe()} [{per[0].source}]")
        else:
            lines.append(f"{kernel.name} {shape}: a schedule per shape bucket")
            lines += [f"  at {bucket}: {c.schedule.describe()} [{c.source}]" for bucket, c in zip(opts.buckets, per)]
        for choice in {id(c): c for c in per}.values() if kernel.name in choices else ():
            if id(choice) in first:
                lines.append(f"  same structure as {first[id(choice)]}")
                continue
            first[id(choice)] = kernel.name
            lines += _searched(choice)
    return "\n".join(lines)


def _searched(choice: Choice) -> list[str]:
    """A searched choice's candidates and rewrites, for explain."""
    lines = []
    if choice.candidates:
        lines.append(f"  {len(choice.candidates)} candidates timed, {choice.failures} failed validation, "
                     f"{choice.seconds:.2f} s:")
        for desc, seconds, is_default in choice.candidates:
            when = "   failed" if seconds is None else f"{seconds * 1e3:9.3f} ms"
            mark = " <- chosen" if desc == choice.schedule.describe() else ""
            lines.append(f"    {when}  {desc}{' (default)' if is_default else ''}{mark}")
    if choice.naive:  # (the rule-chosen default may win without being one of the sampled nests)
        lines += [f"  naive:  {show_nest(choice.naive)}", f"  chosen: {show_nest(choice.nest) or 'the default'}"]
        lines += [f"    - {step}" for step in rewrites(choice.naive, choice.nest)] or ["    (no rewrites)"]
    return lines
