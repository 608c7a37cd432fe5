"""The CPU target's schedules: how one kernel's loops run, one type per kind, and the rules that
pick one without search (`default_schedule`).

The kernel IR says what is computed; a schedule says how. `render.render_kernel` follows it; the
search (compiler/search.py, through space.py) proposes others and keeps the fastest.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from typing import ClassVar, NamedTuple

from ...compiler.analysis import packable_rows, plan_tiles, row_values, stride, vector_body
from ...compiler.kernels import Apply, Kernel, Reduce, loads, walk
from ...compiler.online import online_plan
from ...symbolic import Expr, sym
from .cc import VECTOR_LANES

# below this many inner iterations (analysis.work) threads cost more than they save: a fork/join
# of the (spinning) OpenMP team is ~1-2 µs; 1 << 15 threads the 576x192 k/v projections of a
# small-model decode step (+~10% tok/s over 1 << 18 on SmolLM2-135M, 2 threads). The renderer's
# `if` clauses and the search's cost model both use it.
PARALLEL_MIN_WORK = 1 << 15
# the default register tile (16 vector accumulators with AVX-512, 12 with AVX2's 16 registers) and row block
TILE_ROWS, TILE_COLS, ROW_CHUNK = (8, 32, 64) if VECTOR_LANES == 16 else (6, 16, 64)
ONLINE_ROWS, ONLINE_KEYS = 64, 4 * VECTOR_LANES  # an online-softmax kernel's default block of query rows x keys
#                            (with AVX-512 128 x 64 was the fastest candidate for 8 heads x 64, seq 1024-4096)


@dataclass(frozen=True)
class Loops:
    """Any kernel: a loop per output dim, each reduction a loop inside.

    parallel  how many outer output loops are split across threads (collapsed); 0 = one thread;
              for a scalar output, 1 splits its reduction across threads
    lanes     innermost reductions keep this many partial accumulators (a split reduction)
    simd      the innermost output loop carries `omp simd` (vectorize it, for kernels without
              a reduction)
    """
    kind: ClassVar[str] = "loops"
    parallel: int = 1
    lanes: int = 1
    simd: bool = False

    def describe(self) -> str:
        extra = "".join([f" lanes={self.lanes}" if self.lanes > 1 else "", " simd" if self.simd else ""])
        return f"loops parallel={self.parallel}{extra}"


@dataclass(frozen=True)
class Online:
    """An online-softmax kernel (compiler/online.py; rendered by online.py): blocks of `rows`
    query rows x `keys` keys."""
    kind: ClassVar[str] = "online"
    rows: int = ONLINE_ROWS
    keys: int = ONLINE_KEYS

    def describe(self) -> str:
        return f"online softmax, blocks of {self.rows} rows x {self.keys} keys"


class Block(NamedTuple):
    """One block loop of a tiled schedule (outer to inner)."""
    loop: str  # "j" column blocks, "i" row blocks, "p" where the panels are packed
    threaded: bool  # runs across threads (collapsed with the batch dims)


@dataclass(frozen=True)
class Tiled:
    """A reduction with row x column structure (analysis.plan_tiles): register tiles of ti rows x
    tj columns with the reduction loop outside the tile, panel operands (what depends on the
    column and the reduction, not the row) copied into a contiguous local buffer.

    mc        rows per row block
    order     the block loops outer to inner, one letter each (see Block; capitals are threaded),
              e.g. "JIp", "Jpi" (the defaults): parsed once into `blocks`
    vector    the micro-kernel uses GCC vector types (needs tj % 16 == 0 and a body that is one
              row value times one panel value)
    min_rows  fewer rows than this at run time (a symbolic dim) run the plain loops instead
              (a matrix-vector product has nothing to tile)
    pack_rows the row operands (what depends on the row and the reduction, not the column: a
              normalized input) are computed once for all rows into a buffer before the tiles,
              instead of once per column block
    """
    kind: ClassVar[str] = "tiled"
    ti: int = TILE_ROWS
    tj: int = TILE_COLS
    mc: int = ROW_CHUNK
    order: str = "JIp"
    vector: bool = False
    min_rows: int = 0
    pack_rows: bool = False

    def __post_init__(self):
        """Refuse a malformed order: i and j once each, at most one p, the threaded loops first."""
        if sorted(self.order.lower().replace("p", "", 1)) != ["i", "j"] or "P" in self.order or \
                any(c.isupper() for c in self.order.lstrip("JI")):
            raise ValueError(f"invalid tile order {self.order!r}: want i and j once each, at most one p, "
                             f"the threaded (capital) loops first")

    @cached_property
    def blocks(self) -> list[Block]:
        return [Block(c.lower(), c.isupper()) for c in self.order]

    def packs_in_order(self, packs: bool) -> bool:
        """Whether the order suits a kernel with (`packs`) or without panel operands: with them the
        pack comes once, after the column block it depends on."""
        loops = [b.loop for b in self.blocks]
        return not packs or "p" in loops and loops.index("j") < loops.index("p")

    def describe(self) -> str:
        rows = f" (loops below {self.min_rows} rows)" if self.min_rows else ""
        return (f"tiled {self.ti}x{self.tj} mc={self.mc} order={self.order}"
                f"{' vector' if self.vector else ''}{' rows packed' if self.pack_rows else ''}{rows}")


Schedule = Loops | Tiled | Online
KINDS = {cls.kind: cls for cls in (Loops, Tiled, Online)}


def to_json(schedule: Schedule) -> dict:
    return {"kind": schedule.kind, **asdict(schedule)}


def from_json(data: dict) -> Schedule:
    return KINDS[data["kind"]](**{name: value for name, value in data.items() if name != "kind"})


def default_loops(kernel: Kernel) -> Loops:
    """The plain schedule's rule: thread every output loop of a reduction kernel, and all but
    the innermost of an elementwise one (keep it whole for the vectorizer); a matrix-vector
    product (one output row) can only split its columns."""
    rank = len(kernel.shape)
    reduces = [n for n in walk(kernel.value) if isinstance(n, Reduce)]
    if row_values(kernel):  # rows across threads; each row's reductions in vector lanes
        return Loops(parallel=rank - 1, lanes=64)
    # a kernel of max reductions only (the absmax of int8-quantized blocks) keeps 16 partial maxima:
    # a max is exact in any order, and one NaN-propagating accumulator was a chain of 4 ops per
    # element (the quantization of SmolLM2's decode step: 1.1 ms -> 0.55 ms, two threads)
    # (only over add, mul and less_than: a vectorized sin or log2 may round unlike the scalar one,
    # and amax's gradient compares x == max with x recomputed in another kernel: a mismatch finds
    # no maximum, 0/0)
    exact = all(n.op in ("add", "mul", "less_than") for n in walk(kernel.value) if isinstance(n, Apply))
    maxima = exact and reduces and all(n.op == "max_reduce" and n.extent.is_const and n.extent.value >= 16 for n in reduces)
    # (a scalar output has no loop to thread; parallel=1 then splits its first reduction)
    return Loops(parallel=max(rank, 1) if reduces else max(rank - 1, 1 if rank else 0), lanes=16 if maxima else 1)


def default_schedule(kernel: Kernel) -> Schedule:
    """The rule-chosen schedule (no search): tiles when a reduction has row x column structure.

    A reduction that strides through an operand (the B of a matmul) always tiles. One whose
    operands all run in order along the reduction (x @ W.T, a linear layer, also with quantized
    W dequantized in the loop) tiles only from 4 rows on: its panel (W, dequantized once per
    column block) is then reused by every row, while a single row (decoding) is a dot product
    per output. (Measured here: a Q4_1 1536x576 linear over 512 rows runs ~20x faster tiled.)"""
    if sum(isinstance(n, Reduce) for n in walk(kernel.value)) >= 3:  # (cheap test first)
        if online_plan(kernel) is not None:
            return Online()
    plan = plan_tiles(kernel)
    if plan is None:
        return default_loops(kernel)
    strided = any(stride(ld.index, plan.reduce.var) not in (0, 1, None) for ld in loads(plan.reduce.body))
    rows = kernel.shape[-2] if plan.i is not None else sym(1)
    if not strided and (plan.i is None or not plan.rows or rows.is_const and rows.value < 4):
        return default_loops(kernel)
    ti, tj = (_tile(rows, TILE_ROWS) if plan.i is not None else 1), _tile(kernel.shape[-1], TILE_COLS)
    cols, batched = kernel.shape[-1], len(kernel.shape) > 2
    # Pack each column block's panel once and run every row through it ("Jpi"), threads taking
    # column blocks: enough of them for the threads unless the batch dims are threaded too. With
    # few columns, threads take (column block, row block) pairs and each packs its own ("JIp").
    order = "Jpi" if batched or not cols.is_const or cols.value >= 8 * tj else "JIp"
    vector = tj % 16 == 0 and vector_body(plan) is not None
    # rows that cost more than a load are computed once, not per column block
    pack_rows = packable_rows(kernel, plan) and not (cols.is_const and cols.value <= tj)
    return Tiled(ti=ti, tj=tj, mc=ROW_CHUNK, order=order, vector=vector,
             min_rows=0 if strided or rows.is_const else 4, pack_rows=pack_rows)


def _tile(extent: Expr, preferred: int) -> int:
    return min(preferred, extent.value) if extent.is_const and extent.value > 0 else preferred
