"""Compiling generated C into a shared object, cached on disk by source hash.

The cache lives in $LUMINAR_CACHE (default ~/.cache/luminar). Writes are atomic (compile to a
temporary name, then rename), so an interrupted build never leaves a half-written entry; an
entry that fails to load is treated as corrupt and rebuilt once.
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ...compiler.target import CompilerError, cache_dir

# Not -ffast-math: linked into a shared object it turns on flush-to-zero for the whole host
# process (numpy included), and it assumes no NaN/inf. These are the parts we want: reassociation
# (vectorized reductions), no errno, no trapping. Vector math comes from libmvec through the
# simd declarations in the generated prelude.
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fno-math-errno", "-fno-trapping-math",
         "-fno-signed-zeros", "-fassociative-math", "-freciprocal-math", "-fopenmp", "-shared", "-fPIC"]
LIBS = ["-lm"]  # mandatory: vectorized math calls resolve to libmvec

# libgomp's idle threads spin GOMP_SPINCOUNT times, then sleep in the kernel (default 300,000:
# ~10 ms here). On a shared 2-vCPU VM a sleeping thread's vCPU can take milliseconds to wake, so a
# one-thread trial of the ThreadChooser (program.py) let the worker sleep, every two-thread trial
# after it paid the wake and lost, and a decode stayed on one thread (1.6x slower steps in 4 of 9
# fresh processes, none of 7 with 3,000,000 spins: ~80 ms of spinning after the last parallel
# region, where an idle process then stops). Read when libgomp loads; the user's setting wins.
os.environ.setdefault("GOMP_SPINCOUNT", "3000000")


def cpuinfo() -> str:
    """The text of /proc/cpuinfo, or "" where it cannot be read (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


# Floats per SIMD register of the code -march=native gives: 16 with AVX-512 (F and BW: every
# AVX-512 CPU but the Xeon Phis, whose 8-lane code is the AVX2 one), else 8. (A 64-byte
# GCC vector type on an AVX2-only CPU compiles to piecewise code through memory: a matmul
# micro-kernel ran at 0.6 GFLOP/s where 32-byte vectors reach ~80.)
VECTOR_LANES = 16 if " avx512f" in cpuinfo() and " avx512bw" in cpuinfo() else 8
REGISTERS = 32 if VECTOR_LANES == 16 else 16  # vector registers: what a register tile of accumulators may use


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc or not shutil.which(cc):
        raise CompilerError(f"no C compiler found (tried $CC={os.environ.get('CC')!r}, gcc, cc): the cpu backend "
                            f"needs one; install gcc (apt-get install gcc) or use backend='reference'")
    return cc


def build_many(sources: list[str]) -> list[Path]:
    """Shared objects for several sources; those not cached compile concurrently (one compiler
    process each: the search builds its candidates this way, a few per translation unit)."""
    cc = compiler()
    keys = [hashlib.sha256("\0".join([cc, *FLAGS, *LIBS, source]).encode()).hexdigest()[:32] for source in sources]
    targets = [cache_dir() / f"{key}.so" for key in keys]
    todo = [k for k, target in enumerate(targets) if not target.exists()]
    if not todo:
        return targets
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        jobs = []
        for k in todo:
            src, out = Path(tmp) / f"kernels{k}.c", Path(tmp) / f"kernels{k}.so"
            src.write_text(sources[k])
            command = [cc, *FLAGS, str(src), "-o", str(out), *LIBS]
            jobs.append((k, out, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        for k, out, proc in jobs:
            stderr = proc.communicate()[1]  # (waits for the process)
            if proc.returncode != 0:
                kept = cache_dir() / f"{keys[k]}.failed.c"
                kept.write_text(sources[k])
                raise CompilerError(f"{cc} failed on generated source (kept at {kept}):\n{stderr[-4000:]}")
            os.replace(out, targets[k])  # atomic: readers see no file or a whole one
    return targets


def load(source: str) -> ctypes.CDLL:
    return load_many([source])[0]


def load_many(sources: list[str]) -> list[ctypes.CDLL]:
    libraries = []
    for source, path in zip(sources, build_many(sources)):
        try:
            libraries.append(ctypes.CDLL(str(path)))
        except OSError:  # a corrupt cache entry: rebuild it once
            path.unlink(missing_ok=True)
            libraries.append(ctypes.CDLL(str(build_many([source])[0])))
    return libraries


def function(library: ctypes.CDLL, name: str, argtypes: list, restype=None):
    """The library's C function `name`, typed for ctypes."""
    fn = getattr(library, name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn
