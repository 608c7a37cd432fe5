"""The target seam: everything the compiler and the search know about a backend.

A target is one code generator (C for CPUs; later OpenCL C and CUDA C). The compiler never
imports a backend: `compile_graph` (pipeline.py) and the search (search.py) take a Target and
call only what this interface declares. A target supplies

- schedules: its default schedule for a kernel, and (de)serialization for the tuning cache;
- a schedule space for the search: facts about a kernel and guarded egglog rules over the loop
  nest language of search.py, the map from a sampled nest to a schedule,
  a family for spreading the timed candidates, and a cost estimate for ranking them;
- a bench: compile a batch of candidate schedules of one kernel, validate them against the
  plain loop body, time them;
- a build: render the whole program with the chosen schedules and make it runnable;
- an identity: what besides the kernel a measured schedule depends on (machine, toolchain) and
  which source files are the target's code. Both are part of every tuning-cache key.

Adding a target is writing a subclass that implements every method; no other target, and
nothing under compiler/, changes.
"""
from __future__ import annotations

import importlib
import os
import statistics
import time
from pathlib import Path

from ..errors import LuminarError


class CompilerError(LuminarError, RuntimeError):
    """A target's toolchain is missing or rejected the generated source."""


def cache_dir() -> Path:
    """Where compiled objects and the tuning cache live: $LUMINAR_CACHE (default ~/.cache/luminar)."""
    path = Path(os.environ.get("LUMINAR_CACHE") or Path.home() / ".cache" / "luminar")
    path.mkdir(parents=True, exist_ok=True)
    return path


def time_interleaved(run, which: list[int], budget_s: float, sample_s: float = 0.002) -> dict[int, float]:
    """Median seconds per call of each candidate in `which`, measured in interleaved rounds (one
    sample of each per round, so a burst of outside load hits all alike): `run(k, reps)` calls
    candidate k `reps` times and returns once they are done; a sample repeats the call until it
    lasts about `sample_s`. From the third round on, candidates slower than 1.5x the best so far
    drop out (so every median rests on at least 3 samples, and one burst cannot drop the winner);
    rounds stop when the budget is spent. A target's bench times with this after validating."""
    samples, reps = {k: [] for k in which}, dict.fromkeys(which, 1)
    alive, deadline = list(which), time.perf_counter() + budget_s
    for round_ in range(25 if which else 0):
        for k in alive:
            start = time.perf_counter()
            run(k, reps[k])
            seconds = (time.perf_counter() - start) / reps[k]
            samples[k].append(seconds)
            reps[k] = max(1, min(1000, int(sample_s / max(seconds, 1e-7))))
        if round_ >= 2:
            best = min(statistics.median(samples[k]) for k in alive)
            alive = [k for k in alive if statistics.median(samples[k]) <= 1.5 * best]
            if time.perf_counter() > deadline:
                break
    return {k: statistics.median(v) for k, v in samples.items()}


class Target:
    name: str  # what Graph.compile calls it
    package: str  # the module whose source files are the target's code (see `sources`)

    # -- schedules
    def default_schedule(self, kernel):
        """The schedule rules choose without search."""

    def schedule_to_json(self, schedule) -> dict:
        """The schedule as JSON data (for the tuning cache); schedule_from_json reads it back."""

    def schedule_from_json(self, data: dict):
        """The schedule schedule_to_json wrote."""

    # -- the schedule space
    def space(self, kernel, env: dict):
        """A search.Space (the naive nest and the facts guarding the rules) for the kernel at these
        dim values, or None when the kernel has nothing to search (its default stays)."""

    def rules(self, language) -> tuple[dict, list]:
        """(relations by fact name, rulesets run in stages), built over `language` (search.Language)."""

    def viable(self, kernel, space):
        """A test `(prefix, item) -> bool` pruning nests no schedule can express while sampling."""

    def to_schedule(self, nest: tuple, kernel, space):
        """The schedule a nest describes, or None when this target cannot run it."""

    def family(self, schedule):
        """A key grouping schedules the cost model cannot tell apart: the best of each is timed first."""

    def estimate(self, program, kernel, schedule, env: dict) -> float:
        """Seconds a call should take: only used to rank candidates before timing."""

    def fused_schedules(self, kernel, forms: list[str], env: dict) -> tuple[list, list]:
        """Schedules to time for a fused kernel whose region reached `forms` ("inlined", "online"),
        and [description, None, why] rows for forms not worth timing."""

    def default_fusion(self, kernel, forms: list[str]):
        """Without search: the schedule of the fused kernel a region that reached `forms` takes
        by rule, or None (the default, the stored form: its kernels stay)."""

    # -- measuring and building
    def bench(self, program, kernel, schedules: list, env: dict, seed: int):
        """The schedules of one kernel built for these dims, on random inputs drawn with `seed`: an
        object with `arrays` (buffer id -> the array read, or written by the kernel),
        `validate(expected=None) -> list[bool]` (each schedule's output against the plain loop
        body at sampled positions, or against `expected`, the whole output) and
        `time(which, budget_s) -> {index: median seconds}` (interleaved rounds)."""

    def run_chain(self, program, kernels: list, arrays: dict, env: dict):
        """Run `kernels` in order with their default schedules over `arrays` (buffer id -> array,
        every buffer they touch); returns nothing, the arrays hold the results."""

    def build(self, program, schedules: dict):
        """The program rendered with `schedules` (kernel name -> one schedule per shape bucket; a
        call runs the bucket's that search.nearest_bucket picks for its dims) and made runnable
        (a loaded library for the cpu target)."""

    # -- identity
    def machine(self) -> str:
        """What a measured schedule depends on besides the kernel: device, toolchain, flags."""

    def sources(self) -> list[Path]:
        """The target's code: every Python file of its package. A change to any of them (a new
        candidate, a faster micro-kernel) invalidates the tuning cache's decisions."""
        return sorted(Path(importlib.import_module(self.package).__file__).parent.rglob("*.py"))
