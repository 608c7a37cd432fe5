"""The target seam: everything the compiler and the search know about a backend.

A target is one code generator (C for CPUs; later OpenCL C and CUDA C). The compiler never
imports a backend: `compile_graph` (pipeline.py) and the search (search.py) take a Target and
call only what this interface declares. A target supplies

- schedules: its default schedule for a kernel, and (de)serialization for the tuning cache;
- a schedule space for the search: facts about a kernel and guarded egglog rules over the loop
  nest language of search.py, the map from a nest back to a schedule (and forth, for explain),
  a family for spreading the timed candidates, and a cost estimate for ranking them;
- a bench: compile a batch of candidate schedules of one kernel, validate them against the
  plain loop body, time them;
- a build: render the whole program with the chosen schedules and make it runnable;
- an identity: what besides the kernel a measured schedule depends on (machine, toolchain) and
  which source files are the target's code. Both are part of every tuning-cache key.

Adding a target is writing one of these; no other target, and nothing under compiler/, changes.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path

from ..errors import LuminarError


class CompilerError(LuminarError, RuntimeError):
    """A target's toolchain is missing or rejected the generated source."""


def cache_dir() -> Path:
    """Where compiled objects and the tuning cache live: $LUMINAR_CACHE (default ~/.cache/luminar)."""
    path = Path(os.environ.get("LUMINAR_CACHE") or Path.home() / ".cache" / "luminar")
    path.mkdir(parents=True, exist_ok=True)
    return path


class KernelBench(ABC):
    """Candidate schedules of one kernel, built and run on random inputs for concrete dims."""
    arrays: dict  # buffer id -> the array the candidates read (inputs) or write (the output)

    @abstractmethod
    def validate(self, expected=None) -> list[bool]:
        """Whether each candidate computes the kernel: against its plain loop body at sampled
        output positions, or against `expected` (the whole output) when given."""

    @abstractmethod
    def time(self, which: list[int], budget_s: float) -> dict[int, float]:
        """Median seconds per call of the candidates in `which`, measured in interleaved rounds."""


class Target(ABC):
    name: str  # what Graph.compile calls it
    package: str  # the module whose source files are the target's code (see `sources`)

    # -- schedules
    @abstractmethod
    def default_schedule(self, kernel):
        """The schedule rules choose without search."""

    @abstractmethod
    def schedule_to_json(self, schedule) -> dict: ...

    @abstractmethod
    def schedule_from_json(self, data: dict): ...

    # -- the schedule space
    @abstractmethod
    def space(self, kernel, env: dict):
        """A search.Space (the naive nest and the facts guarding the rules) for the kernel at these
        dim values, or None when the kernel has nothing to search (its default stays)."""

    @abstractmethod
    def rules(self, language) -> tuple[dict, list]:
        """(relations by fact name, rulesets run in stages), built over `language` (search.Language)."""

    @abstractmethod
    def viable(self, kernel, space):
        """A test `(prefix, item) -> bool` pruning nests no schedule can express while sampling."""

    @abstractmethod
    def to_schedule(self, nest: tuple, kernel):
        """The schedule a nest describes, or None when this target cannot run it."""

    @abstractmethod
    def to_nest(self, schedule, kernel, env: dict) -> tuple:
        """The loop nest a schedule runs (for explain)."""

    @abstractmethod
    def family(self, schedule):
        """A key grouping schedules the cost model cannot tell apart: the best of each is timed first."""

    @abstractmethod
    def estimate(self, program, kernel, schedule, env: dict) -> float:
        """Seconds a call should take: only used to rank candidates before timing."""

    @abstractmethod
    def fused_schedules(self, kernel, forms: list[str], env: dict) -> tuple[list, list]:
        """Schedules to time for a fused kernel whose region reached `forms` ("inlined", "online"),
        and [description, None, why] rows for forms not worth timing."""

    # -- measuring and building
    @abstractmethod
    def bench(self, program, kernel, schedules: list, env: dict, seed: int) -> KernelBench: ...

    @abstractmethod
    def run_chain(self, program, kernels: list, arrays: dict, env: dict):
        """Run `kernels` in order with their default schedules over `arrays` (buffer id -> array,
        every buffer they touch); returns nothing, the arrays hold the results."""

    @abstractmethod
    def build(self, program, schedules: dict, buckets: list[dict]):
        """The program rendered with `schedules` (kernel name -> one schedule per bucket) and made
        runnable (a loaded library for the cpu target)."""

    # -- identity
    @abstractmethod
    def machine(self) -> str:
        """What a measured schedule depends on besides the kernel: device, toolchain, flags."""

    def sources(self) -> list[Path]:
        """The target's code: every Python file of its package. A change to any of them (a new
        candidate, a faster micro-kernel) invalidates the tuning cache's decisions."""
        import importlib
        module = importlib.import_module(self.package)
        root = Path(module.__file__).parent if module.__file__.endswith("__init__.py") else Path(module.__file__)
        return sorted(root.rglob("*.py")) if root.is_dir() else [root]
