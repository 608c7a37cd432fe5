"""The cpu backend: the whole graph as one C translation unit, compiled once, called once.

Each kernel becomes a C function whose loops follow a schedule (schedules.py): plain loops (a
loop per output dim, outer ones split across threads with OpenMP, an accumulator loop per
reduction), tiles for reductions with row x column structure (register tiles, packed panels,
vector micro-kernels), or the single-pass online-softmax kernel. Kernels equal up to their
buffers share one function; one entry point `lm_run(buffers, dims)` runs them in order, and
symbolic dims are arguments, so a new sequence length needs no recompile. The compiler reaches
all of this through `target.CPUTarget`; `program.CPUProgram` is the runtime.
"""
from .program import CPUProgram
from .target import CPU, CPUTarget

__all__ = ["CPUProgram", "CPU", "CPUTarget"]
