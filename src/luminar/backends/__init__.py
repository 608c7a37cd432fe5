"""Backends turn an optimized primitive graph into a callable Program.

Each is imported on first use (the cpu backend needs a C compiler, others their device's
runtime): BACKENDS names the module and the Program class of each.
"""
import importlib

from ..errors import UnsupportedError

BACKENDS = {"reference": ("reference", "ReferenceProgram"), "cpu": ("cpu", "CPUProgram"),
            "opencl": ("opencl", "OpenCLProgram"), "cuda": ("cuda", "CUDAProgram")}


def get_backend(name: str):
    """The Program class for backend `name`."""
    if name not in BACKENDS:
        raise UnsupportedError(f"unknown backend {name!r}; available: {', '.join(map(repr, BACKENDS))}")
    module, program = BACKENDS[name]
    return getattr(importlib.import_module(f".{module}", __package__), program)
