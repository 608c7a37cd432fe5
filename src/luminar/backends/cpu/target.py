"""The CPU as a compiler target: C for the whole graph, built by the system C compiler.

Everything the compiler and the search know about this backend goes through `CPUTarget`
(the interface is compiler/target.py); the pieces live beside it: schedules.py (the schedule
types and the default rules), space.py (the schedule space the search explores), render.py and
online.py (C), bench.py (timing candidates), cc.py (the toolchain), program.py (the runtime).
"""
from __future__ import annotations

import ctypes
import os
from typing import NamedTuple

from ...compiler.analysis import plan_tiles, value_at
from ...compiler.search import Space
from ...compiler.target import Target
from . import bench, cc, schedules, space
from .render import render_program


class Built(NamedTuple):
    source: str  # the program's C
    library: ctypes.CDLL  # its shared object, loaded


class CPUTarget(Target):
    name = "cpu"
    package = __package__

    def __init__(self, threads: int | None = None):
        # threads the search's cost model assumes (OMP_NUM_THREADS, else every core)
        self.threads = threads or max(1, min(os.cpu_count() or 1, int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or 64))

    def default_schedule(self, kernel):
        return schedules.default_schedule(kernel)

    def schedule_to_json(self, schedule) -> dict:
        return schedules.to_json(schedule)

    def schedule_from_json(self, data: dict):
        return schedules.from_json(data)

    def space(self, kernel, env: dict) -> Space | None:
        if isinstance(self.default_schedule(kernel), schedules.Online):
            return None  # (its block sizes are chosen by search_fusion)
        return space.space(kernel, env)

    def rules(self, language):
        return space.rules(language)

    def viable(self, kernel, sp: Space):
        tileable = {fact[1] for fact in sp.facts if fact[0] == "tileable"}
        return space.viable(kernel, tileable, ("packable",) in sp.facts)

    def to_schedule(self, nest: tuple, kernel):
        return space.to_schedule(nest, kernel, plan_tiles(kernel), self.default_schedule(kernel))

    def to_nest(self, schedule, kernel, env: dict) -> tuple:
        return space.to_nest(schedule, kernel, env) if not isinstance(schedule, schedules.Online) else ()

    def family(self, schedule):
        return space.family(schedule)

    def estimate(self, program, kernel, schedule, env: dict) -> float:
        return space.estimate(program, kernel, schedule, plan_tiles(kernel), env, self.threads)

    # the online form's blocks of (query rows, keys) timed; the inlined form only for this many columns
    ONLINE_TILES = ((schedules.ONLINE_ROWS, schedules.ONLINE_KEYS), (128, 64), (32, 64), (64, 32))
    INLINE_COLUMNS = 4

    def fused_schedules(self, kernel, forms: list[str], env: dict) -> tuple[list, list]:
        """The online form's block sizes; the inlined form's plain loops, which compute the region's
        values once per output column: only for a few columns, where the recomputation may cost
        less than storing the region."""
        found = [schedules.Online(rows, keys) for rows, keys in self.ONLINE_TILES] * ("online" in forms)
        pruned = []
        if "inlined" in forms:
            loops, columns = schedules.default_loops(kernel), value_at(kernel.shape[-1], env) if kernel.shape else 1
            if columns <= self.INLINE_COLUMNS:
                found.append(loops)
            else:
                pruned.append([loops.describe(), None, f"pruned (recomputes the region for each of {columns} columns)"])
        return found, pruned

    def bench(self, program, kernel, candidates: list, env: dict, seed: int) -> bench.Bench:
        return bench.Bench(program, kernel, candidates, env, seed)

    def run_chain(self, program, kernels: list, arrays: dict, env: dict) -> None:
        bench.run_chain(program, kernels, arrays, env)

    def build(self, program, chosen: dict, buckets: list[dict]) -> Built:
        source = render_program(program, chosen, buckets)
        return Built(source, cc.load(source))

    def machine(self) -> str:
        return bench.machine(self.threads)


CPU = CPUTarget()
