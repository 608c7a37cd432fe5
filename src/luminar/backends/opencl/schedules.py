"""The GPU kernel forms (schedules), independent of the dialect, and the rules that pick one.

A kernel's output is mapped onto a grid of work-groups of work-items:

- `Grid`   one work-item per output element (the flat output index split into work-groups of
           `local`), every reduction serial inside the work-item: any kernel. With `vector` 4 a
           reduction's contiguous float32 operands are read 4 at a time (vector.py; `Rows` too).
- `Rows`   one work-group per output row; the row values (reductions that do not depend on the
           innermost output index: a softmax's max and sum, a norm's mean) are split across the
           work-group's `local` work-items, combined in local memory with barriers, then each
           work-item writes every `local`-th element of the row.
- `Tiled`  a reduction with row x column structure (analysis.plan_tiles: a matmul, also with a
           dequantized weight or a normalized input): work-groups of wi x wj work-items, each
           computing a register tile of ri x rj outputs (strided by wi, wj), so a work-group
           covers (wi*ri) x (wj*rj) outputs; with `local` the row and panel operands of `kt`
           reduction steps are staged in local memory by the whole work-group (barriers around),
           else each work-item computes its own.
- `Split`  a long reduction to few outputs split across work-groups (split.py): each output's
           `groups` work-groups of `local` work-items reduce strided shares, store partials, and
           the last to finish combines them (the OpenCL target's default where it applies).
- `Online` an online-softmax (flash) attention kernel (compiler/online.py, rendered by
           online.py): a work-group per block of `rows` query rows, `lanes` work-items per row,
           keys and values staged `keys` at a time in local memory; the scores never leave it.

Quantized weights need nothing special: the IR already spells dequantization with primitives,
so it happens where the operand is read (once per staged element in `Tiled`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from ...compiler.analysis import plan_tiles, row_values
from ...compiler.kernels import Kernel, Reduce, children, depends_on, walk
from ...compiler.online import online_plan

GROUP = 64  # work-items per work-group of the default Grid and Rows forms
PORTABLE_LOCAL_BYTES = 32768  # local memory every OpenCL device (full profile) has: the default Online form fits in it


@dataclass(frozen=True)
class Grid:
    kind: ClassVar[str] = "grid"
    local: int = GROUP
    vector: int = 1  # 4: serial reductions read their contiguous float32 operands 4 at a time (vector.py)

    def describe(self) -> str:
        return f"grid: an output element per work-item, work-groups of {self.local}{_vector_words(self.vector)}"


@dataclass(frozen=True)
class Rows:
    kind: ClassVar[str] = "rows"
    local: int = GROUP  # a power of two (the local-memory reduction halves it)
    vector: int = 1  # as Grid's: each work-item's share of a row value in runs of 4, read as vectors
    subgroups: bool = False  # combine across each sub-group by shuffles first (render.subgroup_combine)

    def describe(self) -> str:
        where = "by sub-group shuffles, then local memory" if self.subgroups else "in local memory"
        return f"rows: a work-group of {self.local} per row, row values reduced {where}{_vector_words(self.vector)}"


def _vector_words(vector: int) -> str:
    return f", reductions with vector loads of {vector}" if vector > 1 else ""


@dataclass(frozen=True)
class Tiled:
    kind: ClassVar[str] = "tiled"
    wi: int = 8
    wj: int = 8
    ri: int = 2
    rj: int = 2
    kt: int = 16
    local: bool = True

    @property
    def block(self) -> tuple[int, int]:
        """Outputs (rows, columns) one work-group computes."""
        return self.wi * self.ri, self.wj * self.rj

    def local_floats(self, rows: int, panels: int) -> int:
        """Floats of local memory the staged operands take."""
        bi, bj = self.block
        return (bi * rows + bj * panels) * self.kt if self.local else 0

    def describe(self) -> str:
        staged = f", {self.kt} steps staged in local memory" if self.local else ", operands read per work-item"
        return f"tiled: work-groups of {self.wi}x{self.wj}, {self.ri}x{self.rj} outputs per work-item{staged}"


@dataclass(frozen=True)
class Online:
    kind: ClassVar[str] = "online"
    rows: int = 16  # query rows per work-group
    keys: int = 32  # keys (and values) staged in local memory at a time
    lanes: int = 4  # work-items per query row: each scores every lanes-th key, owns every lanes-th output column

    @property
    def group(self) -> int:
        return self.rows * self.lanes

    def local_floats(self, head: int, dot: int) -> int:
        """Floats of local memory: the block's query rows, keys, values, scores and weights, and
        each work-item's partial max and sum."""
        return self.rows * dot + self.keys * (dot + head) + 2 * self.rows * self.keys + 2 * self.group

    def describe(self) -> str:
        return (f"online softmax: work-groups of {self.rows} query rows x {self.lanes} work-items, "
                f"{self.keys} keys staged in local memory at a time")


@dataclass(frozen=True)
class Split:
    kind: ClassVar[str] = "split"
    groups: int = 64  # work-groups per output
    local: int = 64  # work-items per work-group: a power of two (the local-memory reduction halves it)
    # True: each work-item reduces one contiguous run of the reduction (a CPU device: its cache
    # lines stay with one work-item); False: consecutive work-items read consecutive elements (a
    # GPU: coalesced reads)
    runs: bool = False

    def scratch(self, outputs: int) -> int:
        """4-byte words of device scratch a call needs: a counter per output, then the partials."""
        return outputs * (1 + self.groups)

    def describe(self) -> str:
        shares = "a contiguous run per work-item" if self.runs else "strided shares"
        return (f"split: each output's reduction over {self.groups} work-groups of {self.local} ({shares}), "
                "the partials combined in order by the last work-group")


Schedule = Grid | Rows | Tiled | Online | Split
KINDS = {cls.kind: cls for cls in (Grid, Rows, Tiled, Online, Split)}


def to_json(schedule: Schedule) -> dict:
    return {"kind": schedule.kind, **asdict(schedule)}


def from_json(data: dict) -> Schedule:
    fields = dict(data)
    return KINDS[fields.pop("kind")](**fields)


def hoisted_rows(kernel: Kernel) -> list[Reduce]:
    """The row values the Rows form reduces across a work-group, inner ones first: reductions
    that read only the outer output indices and dims (not the innermost index, nor the variable
    of an enclosing reduction; loop variables are the names that start with an underscore)."""
    if not kernel.shape:
        return []
    outer = {v.name for v in kernel.loop_vars[:-1]}
    found = []

    def visit(e):
        for child in children(e):
            visit(child)
        if isinstance(e, Reduce) and e not in found and not any(d.startswith("_") for d in depends_on(e) - outer):
            found.append(e)
    visit(kernel.value)
    return found


def default_schedule(kernel: Kernel) -> Schedule:
    """The online form for a fused attention kernel, tiles for a reduction with row x column
    structure and more than a few rows, a work-group per row for kernels with row values, else an
    output element per work-item."""
    if sum(isinstance(n, Reduce) for n in walk(kernel.value)) >= 3:  # (cheap test first)
        plan = online_plan(kernel)
        if plan is not None and Online().local_floats(kernel.shape[-1].value, plan.dot.extent.value) * 4 <= PORTABLE_LOCAL_BYTES:
            return Online()
    plan = plan_tiles(kernel)
    if plan is not None and plan.i is not None:
        rows = kernel.shape[-2]
        if not rows.is_const or rows.value >= 4:
            return Tiled()
    if row_values(kernel) and hoisted_rows(kernel):
        return Rows()
    return Grid()
