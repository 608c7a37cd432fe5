"""What the machine is and what it can do: description, idle detection, and measured limits.

The limits are measured, not looked up: peak FP32 FLOP/s from a C loop of independent SIMD-register
FMA accumulators, and memory bandwidth from copy and sum over arrays far larger than the
caches. The C is compiled exactly like luminar's kernels (luminar.backends.cpu.cc.build_many: same
compiler, same flags, same cache), so "peak" means what generated C can reach here.
"""
from __future__ import annotations

import ctypes
import os
import platform
import re
import statistics
import subprocess
import time

import numpy as np

# LANES is the machine's SIMD width in floats (luminar.backends.cpu.cc.VECTOR_LANES: 16 with AVX-512,
# 8 on AVX2), set when the source is built: a 64-byte vector type on an AVX2 CPU compiles to code
# through memory and measured a tenth of the real peak.
LIMITS_C = r"""
#include <omp.h>
typedef float v16 __attribute__((vector_size(LANES * 4)));  /* one SIMD register */

/* 12 independent accumulators hide the FMA latency; each step is one FMA per accumulator. Their
   start values depend on the thread number, so the compiler can neither fold nor merge them. */
#define STEP(r) r = r * m + c;
#define INIT(k) (v16){0} + base * (1.0f + 0.01f * k)
double bench_fma(long long iters, int threads, float *sink) {
    double start = 0.0, stop = 0.0;
    #pragma omp parallel num_threads(threads)
    {
        const float base = 1.0f + 1e-3f * (float)omp_get_thread_num();
        const v16 m = (v16){0} + 0.9999999f, c = (v16){0} + 1e-7f;
        v16 r0 = INIT(0), r1 = INIT(1), r2 = INIT(2), r3 = INIT(3), r4 = INIT(4), r5 = INIT(5);
        v16 r6 = INIT(6), r7 = INIT(7), r8 = INIT(8), r9 = INIT(9), r10 = INIT(10), r11 = INIT(11);
        #pragma omp barrier
        #pragma omp master
        start = omp_get_wtime();
        for (long long i = 0; i < iters; i++) {
            STEP(r0) STEP(r1) STEP(r2) STEP(r3) STEP(r4) STEP(r5)
            STEP(r6) STEP(r7) STEP(r8) STEP(r9) STEP(r10) STEP(r11)
        }
        v16 total = r0 + r1 + r2 + r3 + r4 + r5 + r6 + r7 + r8 + r9 + r10 + r11;
        sink[omp_get_thread_num()] = total[0] + total[LANES - 1];
        #pragma omp barrier
        #pragma omp master
        stop = omp_get_wtime();
    }
    return stop - start;
}

/* Explicit vectors: luminar's flags need not allow reassociating a float sum (no -ffast-math). */
double bench_sum(const float *restrict x, long long n, int threads, float *sink) {
    double start = omp_get_wtime();
    const long long blocks = n / (4 * LANES);  /* 4 vectors, 4 independent accumulators */
    float total = 0.0f;
    #pragma omp parallel num_threads(threads) reduction(+:total)
    {
        v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, t0, t1, t2, t3;
        #pragma omp for schedule(static)
        for (long long b = 0; b < blocks; b++) {
            const float *p = x + b * 4 * LANES;
            __builtin_memcpy(&t0, p, sizeof t0); __builtin_memcpy(&t1, p + LANES, sizeof t1);
            __builtin_memcpy(&t2, p + 2 * LANES, sizeof t2); __builtin_memcpy(&t3, p + 3 * LANES, sizeof t3);
            a0 += t0; a1 += t1; a2 += t2; a3 += t3;
        }
        v16 s = a0 + a1 + a2 + a3;
        for (int k = 0; k < LANES; k++) total += s[k];
    }
    for (long long i = blocks * 4 * LANES; i < n; i++) total += x[i];
    *sink = total;
    return omp_get_wtime() - start;
}

double bench_copy(float *restrict dst, const float *restrict src, long long n, int threads) {
    double start = omp_get_wtime();
    const long long blocks = n / LANES;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long long b = 0; b < blocks; b++) {
        v16 t;
        __builtin_memcpy(&t, src + b * LANES, sizeof t);
        __builtin_memcpy(dst + b * LANES, &t, sizeof t);
    }
    for (long long i = blocks * LANES; i < n; i++) dst[i] = src[i];
    return omp_get_wtime() - start;
}
"""

def _fma_flops_per_iter() -> int:
    from luminar.backends.cpu import cc
    return 12 * cc.VECTOR_LANES * 2  # accumulators x lanes x (mul + add)


# -- description ---------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return platform.processor() or "unknown"
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    isa = [f for f in ("avx512f", "avx2", "fma", "amx_tile") if flags and f in flags.group(1).split()]
    return f"{found.group(1).strip() if found else 'unknown'} ({', '.join(isa)})"


def git_revision() -> str:
    """The short commit, noting uncommitted changes under src/ (they change what is measured)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        rev = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "src"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return f"git {rev}{' + uncommitted changes in src/' if dirty else ''}" if rev else "no git"
    except (OSError, subprocess.SubprocessError):
        return "no git"


def compiler_version() -> str:
    from luminar.backends.cpu import cc
    try:
        out = subprocess.run([cc.compiler(), "--version"], capture_output=True, text=True, timeout=30).stdout
        return out.splitlines()[0] if out else "unknown"
    except Exception as e:  # noqa: BLE001 - a description must never stop the bench
        return f"unknown ({e})"


def openblas_info() -> str:
    """The OpenBLAS core numpy uses at run time (threadpoolctl if present, else ask the library)."""
    try:
        import threadpoolctl
        for lib in threadpoolctl.threadpool_info():
            if lib.get("internal_api") == "openblas":
                return f"OpenBLAS {lib.get('version')} {lib.get('architecture')} ({lib.get('num_threads')} threads)"
    except ImportError:
        pass
    for path in _loaded_libraries("openblas"):
        lib = ctypes.CDLL(path)
        for suffix in ("", "64_", "_64"):
            for prefix in ("openblas", "scipy_openblas"):
                fn = getattr(lib, f"{prefix}_get_corename{suffix}", None)
                config = getattr(lib, f"{prefix}_get_config{suffix}", None)
                if fn is not None:
                    fn.restype = ctypes.c_char_p
                    described = config and _call_str(config)
                    return f"{described or 'OpenBLAS'} core {fn().decode()}"
    return "unknown BLAS"


def _call_str(fn) -> str:
    fn.restype = ctypes.c_char_p
    return " ".join(fn().decode().split())


def _loaded_libraries(fragment: str) -> list[str]:
    try:
        maps = open("/proc/self/maps").read().split("\n")
    except OSError:
        return []
    return sorted({line.split()[-1] for line in maps if fragment in line and line.split()[-1].startswith("/")})


# -- idle detection --------------------------------------------------------------------------------
def cpu_times() -> dict[str, list[int]]:
    """Per-CPU jiffies from /proc/stat: {'cpu0': [user, nice, system, idle, iowait, irq, softirq, steal]}."""
    rows = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu"):
                name, *values = line.split()
                rows[name] = [int(v) for v in values[:8]]
    return rows


def idle_fractions(before, after) -> dict[str, float]:
    out = {}
    for cpu in after:
        if cpu == "cpu":
            continue
        delta = [a - b for a, b in zip(after[cpu], before[cpu])]
        total = sum(delta)
        out[cpu] = (delta[3] + delta[4]) / total if total else 1.0
    return out


def wait_for_idle(max_wait_s: float, threshold: float = 0.9, window_s: float = 0.5) -> dict:
    """Sample /proc/stat until every CPU is >= threshold idle over one window, or give up."""
    start = time.perf_counter()
    fractions: dict[str, float] = {}
    while True:
        before = cpu_times()
        time.sleep(window_s)
        fractions = idle_fractions(before, cpu_times())
        waited = time.perf_counter() - start
        if fractions and min(fractions.values()) >= threshold:
            return {"idle": True, "waited_s": round(waited, 2), "idle_fractions": _rounded(fractions)}
        if waited >= max_wait_s:
            return {"idle": False, "waited_s": round(waited, 2), "idle_fractions": _rounded(fractions)}


def _rounded(d):
    return {k: round(v, 3) for k, v in d.items()}


class LoadMonitor:
    """CPU time others used while we measured: (busy time of all CPUs - our own CPU time) / wall.

    Our process's CPU time includes all its threads (OpenMP, OpenBLAS, torch), so what is left
    is other tenants; 'steal' is time the hypervisor gave our vCPUs to someone else.
    """

    def __enter__(self):
        self.wall, self.proc, self.stat = time.perf_counter(), _own_cpu(), cpu_times()["cpu"]
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.wall
        hz = os.sysconf("SC_CLK_TCK")
        delta = [a - b for a, b in zip(cpu_times()["cpu"], self.stat)]
        busy = (sum(delta) - delta[3] - delta[4] - delta[7]) / hz
        self.foreign_cpus = max(busy - (_own_cpu() - self.proc), 0.0) / wall if wall else 0.0
        self.steal_cpus = delta[7] / hz / wall if wall else 0.0
        return False


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


# -- measured limits -------------------------------------------------------------------------------
def _library():
    from luminar.backends.cpu import cc  # same compiler, flags and cache as luminar's kernels
    lib = ctypes.CDLL(str(cc.build_many([f"#define LANES {cc.VECTOR_LANES}\n" + LIMITS_C])[0]))
    lib.bench_fma.argtypes = [ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p]
    lib.bench_sum.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p]
    lib.bench_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int]
    for fn in (lib.bench_fma, lib.bench_sum, lib.bench_copy):
        fn.restype = ctypes.c_double
    return lib


def measure_limits(threads=(1, 2), bandwidth_mb: int = 256, repeats: int = 11, fma_seconds: float = 0.1) -> dict:
    """Peak FMA FLOP/s and copy/sum bandwidth per thread count: median and best of `repeats`.

    The kernels take turns (one run of each per repeat), so a burst of load from another tenant
    lowers one run of each instead of every run of one.
    """
    lib = _library()
    sink = np.zeros(64, np.float32)
    iters = _calibrate_fma(lib, sink, fma_seconds)
    count = bandwidth_mb * 2**20 // 4
    src, dst = np.ones(count, np.float32), np.zeros(count, np.float32)  # touched: pages are mapped
    nbytes = src.nbytes
    kernels = {}  # (name, threads, unit) -> (work per run, run() -> seconds)
    for n in threads:
        kernels[("FMA peak (C, SIMD vectors)", n, "GFLOP/s")] = (
            n * iters * _fma_flops_per_iter(), lambda n=n: lib.bench_fma(iters, n, sink.ctypes.data))
    for n in threads:
        kernels[("sum (C, read)", n, "GB/s")] = (
            nbytes, lambda n=n: lib.bench_sum(src.ctypes.data, count, n, sink.ctypes.data))
        kernels[("copy (C, read + write)", n, "GB/s")] = (
            2 * nbytes, lambda n=n: lib.bench_copy(dst.ctypes.data, src.ctypes.data, count, n))
    kernels[("sum (numpy)", 1, "GB/s")] = (nbytes, lambda: _seconds(src.sum))
    kernels[("copy (numpy copyto)", 1, "GB/s")] = (2 * nbytes, lambda: _seconds(lambda: np.copyto(dst, src)))
    rates = {key: [] for key in kernels}
    for _ in range(repeats):
        for key, (work, run) in kernels.items():
            rates[key].append(work / run() / 1e9)
    rows = [_row(name, n, unit, rates[(name, n, unit)]) for name, n, unit in kernels]
    # A limit is what the machine can do, and other work only ever lowers a measurement: take the best.
    return {"rows": rows, "array_mb": bandwidth_mb,
            "peak_gflops": max(r["best"] for r in rows if r["unit"] == "GFLOP/s"),
            "bandwidth_gbs": max(r["best"] for r in rows if r["unit"] == "GB/s")}


def _calibrate_fma(lib, sink, seconds: float) -> int:
    iters = 1 << 16
    while True:
        elapsed = lib.bench_fma(iters, 1, sink.ctypes.data)
        if elapsed >= 0.02:
            return max(int(iters * seconds / elapsed), 1)
        iters *= 4


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _row(kernel, threads, unit, values):
    return {"kernel": kernel, "threads": threads, "unit": unit,
            "median": statistics.median(values), "best": max(values)}
