"""OpenCL as a compiler target: every kernel in one of the GPU forms, rendered as OpenCL C.

Everything the compiler and the search know about this backend goes through `OpenCLTarget`
(the interface is compiler/target.py); the pieces live beside it: schedules.py (the kernel
forms and the default rules), space.py (the schedule space the search explores), dialect.py
(OpenCL C spellings), render.py (source), vector.py (vector loads), split.py (reductions split
across work-groups: this target's default for long reductions to few outputs, with its own
rules in the space), online.py (the flash form), bench.py (timing candidates), device.py (the
device, builds, the disk cache), program.py (the runtime). The device is looked up at first use, so a
target exists (and the tests can import it) on a machine without OpenCL.
"""
from __future__ import annotations

from typing import NamedTuple

from ...compiler.search import Mark
from ...compiler.target import Target
from . import bench, schedules, space, split
from .device import device
from .render import Call, render_program
from .schedules import Split


class Built(NamedTuple):
    source: str  # the program's OpenCL C
    program: object  # the pyopencl Program built for the device
    calls: list[Call]  # the kernels in order (a schedule per shape bucket: search.nearest_bucket picks)


class OpenCLTarget(Target):
    name = "opencl"
    package = __package__

    schedule_to_json, schedule_from_json = staticmethod(schedules.to_json), staticmethod(schedules.from_json)
    family, viable = staticmethod(space.family), staticmethod(space.viable)
    bench, run_chain = staticmethod(bench.Bench), staticmethod(bench.run_chain)

    def default_schedule(self, kernel):
        """The shared GPU rules (schedules.py), but a long reduction to few outputs split across
        work-groups (split.py)."""
        return Split(runs=device().is_cpu) if split.applies(kernel) else schedules.default_schedule(kernel)

    def rules(self, language):
        facts, stages = space.rules(language)
        split_facts, split_stage = split.rules(language)
        return {**facts, **split_facts}, [*stages, split_stage]

    def space(self, kernel, env: dict):
        dev = device()
        if split.applies(kernel):
            return split.split_space(kernel, env, dev.max_group)
        return space.space(kernel, env, dev.max_group, subgroups=dev.dialect.subgroups is not None)

    def to_schedule(self, nest: tuple, kernel, sp=None):
        dev = device()
        if any(it.dim == "r" and it.kind == "grid" for it in nest if not isinstance(it, Mark)):
            return split.to_split(nest, dev.max_group)
        return space.to_schedule(nest, kernel, dev.max_group, dev.local_bytes) if kernel.shape else None

    def estimate(self, program, kernel, schedule, env: dict) -> float:
        units = device().device.max_compute_units
        if isinstance(schedule, Split):
            return split.estimate(kernel, schedule, env, units, space.RATE)
        return space.estimate(program, kernel, schedule, env, units)

    def fused_schedules(self, kernel, forms: list[str], env: dict) -> tuple[list, list]:
        dev = device()
        return space.fused_schedules(kernel, forms, dev.max_group, dev.local_bytes)

    def build(self, program, chosen: dict) -> Built:
        # (render_program gives a kernel missing from `chosen` the shared rules' schedule: not a split)
        split_defaults = {k.name: self.default_schedule(k) for k in program.kernels if split.applies(k)}
        source, calls = render_program(program, {**split_defaults, **chosen}, device().dialect)
        return Built(source, device().build(source), calls)

    def machine(self) -> str:
        dev = device()
        return " ".join([dev.identity, *dev.options])


OPENCL = OpenCLTarget()
