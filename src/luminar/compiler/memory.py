"""Memory planning: place temporary buffers in one arena, sharing space between buffers whose
lifetimes do not overlap (liveness from the kernel order).

Sizes are symbolic, so a plan is made for concrete dims (backends cache one per dims tuple).
Greedy best-fit by decreasing size; every offset is aligned for vector loads.
"""
from dataclasses import dataclass

from .kernels import KernelProgram, loads

ALIGN = 64  # bytes: one cache line, a full AVX-512 vector


@dataclass(frozen=True)
class MemoryPlan:
    offsets: dict[int, int]  # temp buffer id -> byte offset in the arena
    arena_bytes: int


def lifetimes(program: KernelProgram) -> dict[int, tuple[int, int]]:
    """For each temp buffer: (index of the kernel that writes it, index of the last kernel reading it)."""
    temps = {b.id for b in program.buffers if b.kind == "temp"}
    life = {}
    for k, kernel in enumerate(program.kernels):
        if kernel.out in temps:
            life[kernel.out] = (k, k)
        for load in loads(kernel.value):
            if load.buffer in temps:
                life[load.buffer] = (life[load.buffer][0], k)
    return life


def plan_memory(program: KernelProgram, env: dict[str, int], life: dict[int, tuple[int, int]]) -> MemoryPlan:
    """Place every temp (`life`: the program's `lifetimes`) for these dim values. Sizes only grow
    with the dims, so a plan made for larger values is also valid for smaller ones (backends plan
    for rounded-up dims)."""
    # float32 bytes, rounded up to a multiple of ALIGN
    size = {b.id: (int(b.numel.evaluate(env)) * 4 + ALIGN - 1) // ALIGN * ALIGN for b in program.buffers if b.id in life}
    placed: list[tuple[int, int, int]] = []  # (offset, bytes, buffer id)
    for buf in sorted(size, key=lambda b: (-size[b], b)):
        start, end = life[buf]
        busy = sorted((o, o + n) for o, n, other in placed
                      if not (life[other][1] < start or end < life[other][0]))
        offset = 0
        for lo, hi in busy:  # first gap that fits
            if offset + size[buf] <= lo:
                break
            offset = max(offset, hi)
        placed.append((offset, size[buf], buf))
    return MemoryPlan({b: o for o, _, b in placed}, max((o + n for o, n, _ in placed), default=0))
