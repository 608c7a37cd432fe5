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

from ...compiler.target import Target
from . import bench, cc, schedules, space
from .bench import machine
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

    default_schedule = staticmethod(schedules.default_schedule)
    schedule_to_json, schedule_from_json = staticmethod(schedules.to_json), staticmethod(schedules.from_json)
    rules, family, fused_schedules = staticmethod(space.rules), staticmethod(space.family), staticmethod(space.fused_schedules)
    # (last: from here on `space` in this class body is the method, not the module)
    space, viable, to_schedule = staticmethod(space.space), staticmethod(space.viable), staticmethod(space.to_schedule)
    bench, run_chain = staticmethod(bench.Bench), staticmethod(bench.run_chain)

    def default_fusion(self, kernel, forms: list[str]):
        # The online form wherever a region reaches it: against the stored kernels (bench/fusion_rule.py,
        # Zen 4) SmolLM2-135M prefilled 512 tokens 1.13x and Gemma 3 270M 1.06x faster; decode steps
        # were 0.95-1.06x as fast at contexts 40-400 (within noise), with no seq x seq buffer.
        return schedules.Online(schedules.ONLINE_ROWS, schedules.ONLINE_KEYS) if "online" in forms else None

    def estimate(self, program, kernel, schedule, env: dict) -> float:
        return space.estimate(program, kernel, schedule, env, self.threads)

    def build(self, program, chosen: dict) -> Built:
        source = render_program(program, chosen)
        return Built(source, cc.load(source))

    def machine(self) -> str:
        return machine(self.threads)


CPU = CPUTarget()
