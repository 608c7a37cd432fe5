"""OpenCL as a compiler target: every kernel in one of the GPU forms, rendered as OpenCL C.

Everything the compiler and the search know about this backend goes through `OpenCLTarget`
(the interface is compiler/target.py); the pieces live beside it: schedules.py (the kernel
forms and the default rules), space.py (the schedule space the search explores), dialect.py
(OpenCL C spellings), render.py (source), bench.py (timing candidates), device.py (the device,
builds, the disk cache), program.py (the runtime). The device is looked up at first use, so a
target exists (and the tests can import it) on a machine without OpenCL.
"""
from __future__ import annotations

from typing import NamedTuple

from ...compiler.target import Target
from . import bench, schedules, space
from .device import device
from .render import Call, render_program


class Built(NamedTuple):
    source: str  # the program's OpenCL C
    program: object  # the pyopencl Program built for the device
    calls: list[Call]  # the kernels in order (a schedule per shape bucket: search.nearest_bucket picks)


class OpenCLTarget(Target):
    name = "opencl"
    package = __package__

    default_schedule = staticmethod(schedules.default_schedule)
    schedule_to_json, schedule_from_json = staticmethod(schedules.to_json), staticmethod(schedules.from_json)
    rules, family, viable = staticmethod(space.rules), staticmethod(space.family), staticmethod(space.viable)
    bench, run_chain = staticmethod(bench.Bench), staticmethod(bench.run_chain)

    def space(self, kernel, env: dict):
        return space.space(kernel, env, device().max_group)

    def to_schedule(self, nest: tuple, kernel, sp=None):
        dev = device()
        return space.to_schedule(nest, kernel, dev.max_group, dev.local_bytes)

    def estimate(self, program, kernel, schedule, env: dict) -> float:
        return space.estimate(program, kernel, schedule, env, device().device.max_compute_units)

    def fused_schedules(self, kernel, forms: list[str], env: dict) -> tuple[list, list]:
        dev = device()
        return space.fused_schedules(kernel, forms, dev.max_group, dev.local_bytes)

    def build(self, program, chosen: dict) -> Built:
        source, calls = render_program(program, chosen)
        return Built(source, device().build(source), calls)

    def machine(self) -> str:
        dev = device()
        return " ".join([dev.identity, *dev.options])


OPENCL = OpenCLTarget()
