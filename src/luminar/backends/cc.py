"""Compiling generated C into a shared object, cached on disk by source hash.

The cache lives in $LUMINAR_CACHE (default ~/.cache/luminar). Writes are atomic (compile to a
temporary name, then rename), so an interrupted build never leaves a half-written entry; an
entry that fails to load is treated as corrupt and rebuilt once.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import LuminarError

# Not -ffast-math: linked into a shared object it turns on flush-to-zero for the whole host
# process (numpy included), and it assumes no NaN/inf. These are the parts we want: reassociation
# (vectorized reductions), no errno, no trapping. Vector math comes from libmvec through the
# simd declarations in the generated prelude.
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fno-math-errno", "-fno-trapping-math",
         "-fno-signed-zeros", "-fassociative-math", "-freciprocal-math", "-fopenmp", "-shared", "-fPIC"]
LIBS = ["-lm"]  # mandatory: vectorized math calls resolve to libmvec


class CompilerError(LuminarError, RuntimeError):
    """The C compiler is missing or rejected the generated source."""


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc or not shutil.which(cc):
        raise CompilerError(f"no C compiler found (tried $CC={os.environ.get('CC')!r}, gcc, cc): the cpu backend "
                            f"needs one; install gcc (apt-get install gcc) or use backend='reference'")
    return cc


def cache_dir() -> Path:
    path = Path(os.environ.get("LUMINAR_CACHE") or Path.home() / ".cache" / "luminar")
    path.mkdir(parents=True, exist_ok=True)
    return path


def build(source: str) -> Path:
    """The path of a shared object for `source`, compiling it unless it is cached."""
    cc = compiler()
    key = hashlib.sha256("\0".join([cc, *FLAGS, *LIBS, source]).encode()).hexdigest()[:32]
    target = cache_dir() / f"{key}.so"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        src = Path(tmp) / "kernels.c"
        src.write_text(source)
        out = Path(tmp) / "kernels.so"
        proc = subprocess.run([cc, *FLAGS, str(src), "-o", str(out), *LIBS], capture_output=True, text=True)
        if proc.returncode != 0:
            kept = cache_dir() / f"{key}.failed.c"
            kept.write_text(source)
            raise CompilerError(f"{cc} failed on generated source (kept at {kept}):\n{proc.stderr[-4000:]}")
        os.replace(out, target)  # atomic: readers see no file or a whole one
    return target


def load(source: str) -> ctypes.CDLL:
    path = build(source)
    try:
        return ctypes.CDLL(str(path))
    except OSError:  # a corrupt cache entry: rebuild it once
        path.unlink(missing_ok=True)
        return ctypes.CDLL(str(build(source)))
