"""The compile pipeline, for any target: lower -> fuse -> schedule or search -> plan -> build.

`compile_graph` turns an optimized primitive graph into what a backend's runtime needs: the
kernel program, each kernel's schedule (one per shape bucket when searched), the kernels'
buffer lifetimes (memory plans are made from them per call's dims, compiler/memory.py), and the
target's built artifact. A backend's Program keeps only the runtime: buffers and calls.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import search as search_module
from .kernels import KernelProgram, Lowering
from .memory import lifetimes
from .target import Target


@dataclass
class Compiled:
    target: Target
    kernels: KernelProgram
    lifetimes: dict  # temp buffer id -> (first kernel, last kernel): the memory plan's input
    built: object  # what target.build made (the cpu target: its C source and loaded library)
    build_seconds: float
    search: search_module.SearchOptions | None = None
    choices: dict = field(default_factory=dict)  # kernel name -> a search.Choice per shape bucket
    fusions: list = field(default_factory=list)  # search.Fusion per softmax region

    def explain(self) -> str:
        """Text: each kernel's schedule and where it came from; with search, the candidates tried
        with their times and the rewrites that turned the naive loop nest into the chosen one."""
        return search_module.explain(self.target, self.kernels, self.choices, self.search, self.fusions)


def compile_graph(graph, target: Target, search=None, search_dims=None, seed: int = 0) -> Compiled:
    """Compile `graph` for `target`. Options: `search` False (default; LUMINAR_SEARCH may turn it
    on), True (a default time budget) or seconds; `search_dims` {dim: value or [values]} the shape
    buckets searched (default 128 each); `seed` for the candidates sampled. See search.py."""
    lowering = Lowering(graph)
    opts = search_module.options(search, search_dims, seed, dims=sorted(graph.dims()))
    fusions, choices = [], {}
    if opts:
        kernels, fusions, fixed = search_module.search_fusion(target, lowering, lowering.run(), opts)
        choices = search_module.search_program(target, kernels, opts, fixed)
    else:  # rules only: the fusion regions the target fuses unmeasured (Target.default_fusion)
        kernels, choices = search_module.default_fusion(target, lowering)
    started = time.perf_counter()
    built = target.build(kernels, {name: [c.schedule for c in per] for name, per in choices.items()})
    return Compiled(target, kernels, lifetimes(kernels), built, time.perf_counter() - started, opts, choices, fusions)
