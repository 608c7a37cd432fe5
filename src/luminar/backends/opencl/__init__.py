"""The opencl backend: GPU kernel forms rendered as OpenCL C, built and run through pyopencl.

Each kernel's output is mapped onto a grid of work-groups of work-items (schedules.py): an
element per work-item, a work-group per row reducing its row values in local memory, or tiles
of a matmul-shaped reduction staged in local memory with register tiles per work-item. The
forms are written against a small dialect table (dialect.py), so a CUDA target can render the
same forms. It runs on any OpenCL device, and on the CPU through PoCL, which is how CI executes
and checks every GPU schedule without a GPU. The compiler reaches it through
`target.OpenCLTarget`; `program.OpenCLProgram` is the runtime.
"""
from .device import DeviceError
from .program import OpenCLProgram
from .target import OPENCL, OpenCLTarget

__all__ = ["DeviceError", "OpenCLProgram", "OPENCL", "OpenCLTarget"]
