"""Interleaved timing: every round calls each contender once, so a burst of load from another
tenant hits all contenders alike instead of ruining one of them. Medians, not means.

A contender stops sampling once it has spent its time budget (a slow kernel gets few samples,
never less than one); a fast one repeats its call `number` times per sample so that a sample
lasts long enough for the clock to resolve it.

Thread pools keep spinning after a call (OpenBLAS's workers for ~0.1 s, libgomp's for a few
ms), and on a two-CPU machine a pool left spinning by one contender steals a CPU from the next.
So between samples the harness waits until no thread of the process is running (`settle`): each
contender starts its sample the way it would start in a program of its own. Waking sleeping
threads (and, in a VM, idle vCPUs) after that pause can cost milliseconds, so a fast contender
gets one untimed call right before its sample: the sample measures the steady state.
"""
from __future__ import annotations

import gc
import os
import statistics
import threading
import time
from dataclasses import dataclass, field


REWARM_BELOW_S = 0.02  # calls shorter than this get an untimed call before each sample


@dataclass
class Samples:
    number: int  # calls per sample
    rewarm: bool  # one untimed call before each sample (fast calls, where waking threads would show)
    seconds: list[float] = field(default_factory=list)  # per call, one entry per sample
    spent: float = 0.0  # total seconds timed
    settled: list[float] = field(default_factory=list)  # seconds waited for this process to go quiet after a sample

    def summary(self) -> dict:
        s = sorted(self.seconds)
        return {"median_ms": statistics.median(s) * 1e3, "best_ms": s[0] * 1e3,
                "q1_ms": s[len(s) // 4] * 1e3, "q3_ms": s[(3 * len(s)) // 4] * 1e3,
                "samples": len(s), "calls_per_sample": self.number,
                "settle_ms": statistics.median(self.settled) * 1e3 if self.settled else 0.0,
                "all_ms": [round(v * 1e3, 5) for v in self.seconds]}


def _call_seconds(fn, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _running_threads() -> int:
    """Threads of this process, other than the caller, that are running or runnable (state R)."""
    me = threading.get_native_id()
    running = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread exited
            continue
        running += stat[stat.rindex(")") + 2] == "R"
    return running


def settle(max_s: float = 0.3, poll_s: float = 0.001) -> float:
    """Sleep until no other thread of this process is running: thread pools stopped spinning.

    Thread states rather than CPU time: the kernel credits other threads' CPU time only at
    scheduler ticks, too coarse to see a pool that spins for a few milliseconds.
    """
    start = time.perf_counter()
    if not os.path.isdir("/proc/self/task"):
        time.sleep(0.1)  # no /proc: a fixed pause longer than the usual spin-wait
        return time.perf_counter() - start
    quiet = 0
    while time.perf_counter() - start < max_s and quiet < 2:
        time.sleep(poll_s)
        quiet = quiet + 1 if _running_threads() == 0 else 0
    return time.perf_counter() - start


def interleaved(contenders: dict, *, max_rounds: int, min_rounds: int, budget_s: float,
                sample_s: float = 0.01, warm_calls: dict | None = None) -> dict[str, dict]:
    """Time zero-argument callables round-robin; returns {name: summary}.

    `warm_calls` maps a name to the seconds of a call already made (e.g. the correctness check);
    a contender slower than the budget is not warmed up again, others are called up to 3 times.
    """
    warm_calls = warm_calls or {}
    state = {}
    for name, fn in contenders.items():
        first = warm_calls.get(name, float("inf"))
        if name not in warm_calls or first < budget_s:
            spent = 0.0
            for _ in range(3):  # warm-up: caches, thread pools, lazy allocations; calibrate on the fastest call
                seconds = _call_seconds(fn, 1)
                first, spent = min(first, seconds), spent + seconds
                if spent >= budget_s:
                    break
        settle()
        state[name] = Samples(number=max(1, min(1000, int(sample_s / max(first, 1e-9)))),
                              rewarm=first < REWARM_BELOW_S)

    def wants_more(s: Samples) -> bool:
        n = len(s.seconds)
        if n == 0:
            return True
        if n >= max_rounds:
            return False
        if s.spent < budget_s:
            return True
        return n < min_rounds and s.spent + s.seconds[-1] * s.number <= 3 * budget_s

    names = list(contenders)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for round_index in range(max_rounds):
            order = names[round_index % len(names):] + names[:round_index % len(names)]  # rotate: no fixed neighbour
            active = [n for n in order if wants_more(state[n])]
            if not active:
                break
            for name in active:
                s = state[name]
                if s.rewarm:
                    contenders[name]()  # wake its threads (and idle CPUs) after the settle: time the steady state
                per_call = _call_seconds(contenders[name], s.number)
                s.seconds.append(per_call)
                s.spent += per_call * s.number
                s.settled.append(settle())
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: s.summary() for name, s in state.items()}
