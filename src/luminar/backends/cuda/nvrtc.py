"""CUDA C to cubin with NVRTC, cached on disk; what ptxas reported about each kernel.

NVRTC (the `nvidia-cuda-nvrtc` wheel, reached through `cuda-bindings`) compiles without a GPU
or a driver, so every kernel the cuda target writes is compiled and checked on any machine.
It emits a cubin for one real architecture (sm_90 on the H200), never PTX: PTX from an NVRTC
newer than the driver does not load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), a cubin does.

Compiled programs are cached under $LUMINAR_CACHE/cuda by a hash of the source, the options
and the NVRTC version, with ptxas's verbose report (registers, spills per kernel) beside the
cubin; both are written atomically, the cubin last, so a reader sees a whole pair or none.
A rejected source is a CompilerError quoting the numbered lines NVRTC points at, and its log.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass

from ...compiler.target import CompilerError, cache_dir
from ..opencl.device import _quote_lines

# --fmad=false: a * b + c rounds twice, as the reference does (the OpenCL prelude's FP_CONTRACT OFF);
# division and square root stay IEEE-rounded (NVRTC's default -prec-div/-prec-sqrt=true).
OPTIONS = ("--fmad=false", "--std=c++17", "-Xptxas=-v")
INSTALL = "pip install 'cuda-bindings==13.0.*' 'nvidia-cuda-nvrtc==13.0.*' (or luminar[cuda])"


@functools.cache  # (every driver call asks for them; a failed import raises each time, not cached)
def bindings():
    """(driver, nvrtc) modules of cuda-bindings, whichever layout the installed version has."""
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError:
        try:  # cuda-python before 12.6 spelled them cuda.cuda and cuda.nvrtc
            from cuda import cuda as driver, nvrtc
        except ImportError:
            raise CompilerError(f"the cuda target needs cuda-bindings and NVRTC: {INSTALL}") from None
    return driver, nvrtc


@functools.cache
def version() -> tuple[int, int]:
    """NVRTC's (major, minor); a CompilerError when its library cannot be loaded."""
    _, nvrtc = bindings()
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as e:  # (the wheel's loader raises its own error types when libnvrtc is missing)
        raise CompilerError(f"NVRTC could not be loaded ({type(e).__name__}: {e}); {INSTALL}") from None
    if int(err) != 0:
        raise CompilerError(f"NVRTC could not be loaded ({err}); {INSTALL}")
    return int(major), int(minor)


@dataclass(frozen=True)
class Usage:
    """What ptxas reported for one kernel function."""
    registers: int
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    stack: int  # bytes of stack frame

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass(frozen=True)
class Cubin:
    image: bytes  # the cubin, for cuModuleLoadData
    arch: str  # "sm_90"
    log: str  # ptxas's verbose report
    usage: dict  # function name -> Usage
    cached: bool  # read from the disk cache


def parse_usage(log: str) -> dict[str, Usage]:
    """Per kernel function, the registers, spills and stack ptxas reported (-Xptxas=-v)."""
    usage, current, frame = {}, None, (0, 0, 0)
    for line in log.splitlines():
        if m := re.search(r"Function properties for (\S+)", line):
            current, frame = m.group(1), (0, 0, 0)
        elif current and (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            frame = tuple(int(x) for x in m.groups())
        elif current and (m := re.search(r"Used (\d+) registers", line)):
            usage[current] = Usage(int(m.group(1)), frame[1], frame[2], frame[0])
            current = None
    return usage


def quote_lines(source: str, log: str) -> str:
    """The source lines NVRTC's log points at (`luminar.cu(LINE): error`), numbered, with context."""
    return _quote_lines(source, log, where=r"\((\d+)\): (?:error|catastrophic)")


def _write(path, data: bytes) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
        f.write(data)
    os.replace(f.name, path)  # atomic: readers see no file or a whole one


def compile_cubin(source: str, arch: str = "sm_90", options: tuple = ()) -> Cubin:
    """`source` compiled by NVRTC to a cubin for `arch`, from the disk cache when there."""
    options = (*OPTIONS, f"--gpu-architecture={arch}", *options)
    major, minor = version()
    key = hashlib.sha256("\0".join([f"nvrtc {major}.{minor}", *options, source]).encode()).hexdigest()[:32]
    folder = cache_dir() / "cuda"
    folder.mkdir(exist_ok=True)
    image_path, log_path = folder / f"{key}.cubin", folder / f"{key}.log"
    if image_path.exists() and log_path.exists():
        log = log_path.read_text()
        return Cubin(image_path.read_bytes(), arch, log, parse_usage(log), True)
    _, nvrtc = bindings()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"luminar.cu", 0, [], [])
    if int(err) != 0:
        raise CompilerError(f"NVRTC could not create a program: {err}")
    try:
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buffer = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buffer)
        log = buffer.rstrip(b"\0 ").decode(errors="replace")
        if int(result) != 0:
            kept = folder / f"{key}.failed.cu"
            _write(kept, source.encode())
            raise CompilerError(f"NVRTC ({major}.{minor}, {arch}) rejected the generated CUDA C (kept at {kept}):\n"
                                f"{quote_lines(source, log)}\nNVRTC log:\n{log[-4000:]}")
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        image = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, image)
        if int(err) != 0 or not size:
            raise CompilerError(f"NVRTC gave no cubin for {arch} ({err}): is {arch} a real architecture?")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    _write(log_path, log.encode())
    _write(image_path, image)
    return Cubin(image, arch, log, parse_usage(log), False)
