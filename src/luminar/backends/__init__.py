"""Backends turn an optimized primitive graph into a callable Program."""
from ..errors import UnsupportedError


def get_backend(name: str):
    """The Program class for backend `name`."""
    if name == "reference":
        from .reference import ReferenceProgram
        return ReferenceProgram
    if name == "cpu":
        from .cpu import CPUProgram
        return CPUProgram
    if name == "opencl":
        from .opencl import OpenCLProgram
        return OpenCLProgram
    raise UnsupportedError(f"unknown backend {name!r}; available: 'reference', 'cpu', 'opencl'")
