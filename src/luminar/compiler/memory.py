"""Memory planning: place temporary buffers in one arena, sharing space between buffers whose
lifetimes do not overlap (liveness from the kernel order).

Sizes are symbolic, so a plan is made for concrete dims (backends cache one per dims tuple).
Greedy best-fit by decreasing size; every offset is aligned for vector loads.
"""
from dataclasses import dataclass

import numpy as np

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


def sizing_dims(program: KernelProgram, life: dict[int, tuple[int, int]]) -> list[str]:
    """The dims some temp's size depends on (`life`: the program's `lifetimes`): the only ones a
    plan varies with. A KV cache's length is none of them (the cache is an input)."""
    return sorted({v for b in program.buffers if b.id in life for v in b.numel.vars()})


def plan_memory(program: KernelProgram, env: dict[str, int], life: dict[int, tuple[int, int]]) -> MemoryPlan:
    """Place every temp (`life`: the program's `lifetimes`) for these dim values. Sizes only grow
    with the dims, so a plan made for larger values is also valid for smaller ones (backends plan
    for rounded-up dims)."""
    # float32 bytes, rounded up to a multiple of ALIGN
    size = {b.id: (int(b.numel.evaluate(env)) * 4 + ALIGN - 1) // ALIGN * ALIGN for b in program.buffers if b.id in life}
    order = sorted(size, key=lambda b: (-size[b], b))
    sizes = np.array([size[b] for b in order], np.int64)
    first, last = (np.array([life[b][end] for b in order], np.int64) for end in (0, 1))
    offsets = np.zeros(len(order), np.int64)
    # (numpy per buffer over the ones placed before it: a decode graph's ~1000 temps took 66-101 ms
    # as a Python loop over pairs (27-31 ms now; 16 ms on a later machine), once per plan)
    for k in range(len(order)):
        live = (last[:k] >= first[k]) & (last[k] >= first[:k])  # lifetimes overlap: the space is taken
        lo, hi = offsets[:k][live], offsets[:k][live] + sizes[:k][live]
        by_start = np.argsort(lo, kind="stable")
        lo, reach = lo[by_start], np.concatenate([[0], np.maximum.accumulate(hi[by_start])])
        gaps = np.flatnonzero(reach[:-1] + sizes[k] <= lo)  # the first gap that fits, else above all
        offsets[k] = reach[gaps[0]] if len(gaps) else reach[-1]
    return MemoryPlan({b: int(o) for b, o in zip(order, offsets)}, int((offsets + sizes).max(initial=0)))
