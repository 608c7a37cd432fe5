"""The CPU target's runtime: a compiled graph's shared object, its arena and its calls.

compiler/pipeline.py does everything up to a built and loaded shared object; a CPUProgram keeps
only what a call needs: the entry points, memory plans per dim bucket, the buffers' addresses,
and how many threads each kind of call uses (measured, see ThreadChooser).
"""
from __future__ import annotations

import ctypes
import itertools
import operator
import os
import sys
import time

import numpy as np

from ...compiler import pipeline
from ...compiler.search import nearest_bucket
from ...compiler.memory import ALIGN, MemoryPlan, plan_memory, sizing_dims
from ...program import Program
from . import cc


SWITCH_MARGIN = 0.85  # a trial thread count must take at most this fraction of the current one's time


BIG_LOSS = 1.5  # a trial this many times slower than the current count backs off 16x, not 2x


class ThreadChooser:
    """How many OpenMP threads each call of a program uses, chosen by measuring.

    On a shared machine a two-thread call can be 50x slower than a one-thread call: each of a
    model's hundreds of parallel regions waits for a thread the OS has parked while another
    process holds the core. So every kind of call (one per memory plan) keeps a running time for
    the thread count it uses and now and then tries the other count (all threads or one); a
    trial that wins (by SWITCH_MARGIN: noise alone must not make the count flap) switches, one
    that loses waits twice as long before the next (16 times as long when it lost by BIG_LOSS:
    a one-thread trial of a 0.8 s prefill costs 0.8 s).
    """
    def __init__(self, most: int, set_threads):
        self.most, self._set = most, set_threads
        self._state: dict = {}

    def run(self, key, call) -> None:
        if self.most < 2:
            return call()
        # (the first call of a kind pays for page faults and cold caches: it is not a sample)
        s = self._state.setdefault(key, {"use": self.most, "time": {}, "next": 3, "every": 2, "cold": True})
        s["next"] -= 1
        other = 1 if s["use"] == self.most else self.most
        threads = other if s["next"] <= 0 else s["use"]
        self._set(threads)
        started = time.perf_counter()
        call()
        seconds = time.perf_counter() - started
        if threads == other:
            current = s["time"].get(s["use"], float("inf"))
            better = seconds < SWITCH_MARGIN * current
            # a trial lost by far (all threads 2x faster at prefill) waits much longer for the next
            s["next"] = s["every"] = 2 if better else min(s["every"] * (16 if seconds > BIG_LOSS * current else 2), 1024)
            if better:
                s["use"] = other
        if not s.pop("cold", False):  # a running mean; a count's first sample is its mean
            s["time"][threads] = 0.5 * (s["time"].get(threads, seconds) + seconds)


class CPUProgram(Program):
    """A graph compiled to one shared object; calling it runs every kernel in one C call.

    LUMINAR_DEBUG=1 prints each call's per-kernel times. `source` is the generated C, `kernels`
    the kernel IR. Memory plans are kept per value of the dims that size temps, rounded up to
    powers of two, so their number stays small (see memory_plan).
    """
    backend = "cpu"

    def __init__(self, graph, search=None, search_dims=None, seed=0, target=None):
        """Options: `search`, `search_dims`, `seed` (see compiler/pipeline.compile_graph); `target`
        a CPUTarget (default: the machine's; a variant with another schedule space also serves).
        Graph.compile refuses any other option."""
        super().__init__(graph)
        from .target import CPU
        self.debug = int(os.environ.get("LUMINAR_DEBUG", "0") or 0)
        self.compiled = pipeline.compile_graph(graph, target or CPU, search, search_dims, seed)
        self.kernels, self.search = self.compiled.kernels, self.compiled.search
        self.choices, self.fusions = self.compiled.choices, self.compiled.fusions
        self.source, self.library = self.compiled.built
        self._sizing_dims = sizing_dims(self.kernels, self.compiled.lifetimes)
        self._run = cc.function(self.library, "lm_run", [ctypes.c_void_p] * 2)
        self._run_profiled = cc.function(self.library, "lm_run_profiled", [ctypes.c_void_p] * 3)
        self.threads = ThreadChooser(cc.function(self.library, "omp_get_max_threads", [], ctypes.c_int)(),
                                     cc.function(self.library, "omp_set_num_threads", [ctypes.c_int]))
        self._plans: dict[tuple, MemoryPlan] = {}
        self._arena = np.empty(0, np.float32)
        # id(memory plan) -> (the buffers' addresses, the array each input's address is of)
        self._pointers: dict[int, tuple[ctypes.Array, list]] = {}
        self._input_buffers = list(self.kernels.inputs.values())
        self._outputs: dict[str, tuple] = {}  # output name -> (the array the last call returned, its address)
        if self.debug >= 1:
            print(f"[luminar] cpu: {len(self.kernels.kernels)} kernels, shared object ready in "
                  f"{self.compiled.build_seconds * 1e3:.0f} ms", file=sys.stderr)

    def explain(self) -> str:
        """Text: each kernel's schedule and where it came from (per shape bucket where they
        differ); with search, the candidates tried with their times and the rewrites that turned
        the naive loop nest into the chosen one."""
        return self.compiled.explain()

    def memory_plan(self, env: dict[str, int], exact: bool = False) -> MemoryPlan:
        """The arena layout for these dim values. Calls plan for the dims that size some temp,
        rounded up to a power of two; `exact` plans for the values given. A KV cache's length sizes
        no temp (the cache is an input), so a growing cache never re-plans: a decode graph's ~900
        temps took ~16 ms to place, and each new plan restarted the thread count's trials."""
        bucket = dict(env) if exact else {d: 1 << max(int(env[d]) - 1, 0).bit_length() for d in self._sizing_dims}
        key = (exact, *sorted(bucket.items()))
        if key not in self._plans:  # (never dropped: the buffers' addresses are cached by id(plan))
            self._plans[key] = plan_memory(self.kernels, bucket, life=self.compiled.lifetimes)
        return self._plans[key]

    def execute(self, arrays, env):
        kp = self.kernels
        plan = self.memory_plan(env)
        if self._arena.nbytes < plan.arena_bytes + ALIGN:  # one arena, grown to the largest plan
            self._arena = np.empty((plan.arena_bytes + ALIGN) // 4, np.float32)
            self._pointers.clear()
            self._base = self._arena.ctypes.data + (-self._arena.ctypes.data) % ALIGN  # (.ctypes: ~40 us a call)
        # Filling ~1000 pointers (numpy's .ctypes per array) cost ~0.8 ms a call, a tenth of a decode
        # step's kernels: the temps' pointers are kept per plan, an input's while it is the same array.
        if id(plan) not in self._pointers:
            pointers = (ctypes.c_void_p * len(kp.buffers))()
            for buf, offset in plan.offsets.items():
                pointers[buf] = self._base + offset
            self._pointers[id(plan)] = pointers, [None] * len(kp.inputs)
        (pointers, filled), results = self._pointers[id(plan)], {}
        # Only an input array not seen by this plan's pointers before costs numpy's .ctypes; the
        # test of which changed runs in C (map, compress), not as a Python loop over the weights.
        current = list(map(arrays.__getitem__, kp.inputs))
        for i in itertools.compress(range(len(current)), map(operator.is_not, current, filled)):
            filled[i], pointers[self._input_buffers[i]] = current[i], current[i].ctypes.data
        for name, buf in kp.outputs.items():
            shape = tuple([d.evaluate(env) for d in kp.output_shapes[name]])  # (ints: env's are; a list is faster)
            last, address = self._outputs.get(name, (None, 0))
            # Reuse last call's array when nothing else refers to it (only this dict's tuple, `last`
            # and getrefcount's argument): its pages are already mapped, where a fresh large array
            # page-faults on every first write.
            if last is None or last.shape != shape or sys.getrefcount(last) != 3:
                last = np.empty(shape, np.float32)
                address = last.ctypes.data
            results[name], self._outputs[name], pointers[buf] = last, (last, address), address
        dims = (ctypes.c_longlong * (len(kp.dims) + 1))(*[env[d] for d in kp.dims], nearest_bucket(self.search, env))
        # (a profiled call too runs with the thread count the chooser picks, so its times are a call's)
        self.threads.run(id(plan), lambda: self._profile(pointers, dims) if self.debug >= 1 else self._run(pointers, dims))
        return results

    def _profile(self, pointers, dims):
        seconds = (ctypes.c_double * max(len(self.kernels.kernels), 1))()
        self._run_profiled(pointers, dims, seconds)
        total = sum(seconds[:len(self.kernels.kernels)])
        print(f"[luminar] cpu call: {total * 1e3:.3f} ms in {len(self.kernels.kernels)} kernels", file=sys.stderr)
        for k, t in zip(self.kernels.kernels, seconds):
            print(f"[luminar]   {t * 1e3:9.3f} ms  {k.name} {tuple(str(d) for d in k.shape)}", file=sys.stderr)
