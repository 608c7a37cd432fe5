"""The OpenCL device: finding it, building programs for it (cached on disk), its identity.

Everything that talks to the OpenCL runtime through pyopencl at build time lives here, and the
errors a user can meet: no pyopencl, no platform or device (`DeviceError`, with how to install
one), a build the device's compiler rejects (`CompilerError` with the failing source lines and
the build log), and running out of device memory.

Built programs are cached under $LUMINAR_CACHE/opencl by a hash of the source, the build
options and the device's identity, written atomically; a cached binary the driver refuses is
rebuilt from source. Not on PoCL (the CPU driver CI uses): it keeps its own on-disk kernel
cache keyed by source and device (~/.cache/pocl), and exporting a binary makes it compile every
kernel's work-group function ahead (seconds per program, measured 4.5 s for two kernels on the
loaded machine), work a launch does lazily for the work-group sizes it meets.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile

from ...compiler.target import CompilerError, cache_dir
from ...errors import UnsupportedError
from .dialect import opencl_dialect

BUILD_OPTIONS = ["-cl-fp32-correctly-rounded-divide-sqrt"]  # division and sqrt as IEEE (and numpy) round them
INSTALL = ("install an OpenCL driver: on Debian/Ubuntu `apt-get install pocl-opencl-icd ocl-icd-libopencl1` "
           "(PoCL runs OpenCL on the CPU), or your GPU vendor's OpenCL ICD")


class DeviceError(UnsupportedError):
    """No usable OpenCL device (or pyopencl), or the device ran out of memory."""


def opencl():
    """The pyopencl module, or a DeviceError saying how to get it."""
    try:
        import pyopencl
    except ImportError:
        raise DeviceError("the opencl backend needs pyopencl: pip install pyopencl (or luminar[opencl]); "
                          f"and an OpenCL driver: {INSTALL}") from None
    return pyopencl


class Device:
    """One OpenCL device with its context and an in-order queue."""

    def __init__(self, device):
        cl = opencl()
        self.device, self.context = device, cl.Context([device])
        self.queue = cl.CommandQueue(self.context)
        self.max_group = device.max_work_group_size
        self.local_bytes = device.local_mem_size
        self.is_cpu = bool(device.type & cl.device_type.CPU)  # (PoCL here: some forms' defaults differ, see split.py)
        self.dialect = opencl_dialect(set(device.extensions.split()), self._features())  # (sub-groups where reported)
        self.options = [o for o in BUILD_OPTIONS if self._supports_exact_divide()]
        self.caches_builds = "Portable Computing Language" in device.platform.name  # PoCL: see the module's doc

    def _features(self) -> set[str]:
        """The OpenCL C 3.0 optional features the device reports (none before 3.0)."""
        try:
            return {feature.name for feature in self.device.opencl_c_features}
        except (AttributeError, opencl().LogicError):
            return set()

    def _supports_exact_divide(self) -> bool:
        cl = opencl()
        return bool(self.device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT)

    @functools.cached_property
    def identity(self) -> str:
        """What a build and a measured schedule depend on: platform, device, driver."""
        d = self.device
        return " | ".join([d.platform.name, d.platform.version, d.name, d.version, d.driver_version,
                           str(d.max_compute_units)])

    def build(self, source: str):
        """The source built for this device (a pyopencl Program), from the disk cache when there."""
        cl = opencl()
        key = hashlib.sha256("\0".join([self.identity, *self.options, source]).encode()).hexdigest()[:32]
        folder = cache_dir() / "opencl"
        folder.mkdir(exist_ok=True)
        path = folder / f"{key}.bin"
        if self.caches_builds:
            return self._from_source(source, folder / f"{key}.failed.cl")
        if path.exists():
            try:
                return cl.Program(self.context, [self.device], [path.read_bytes()]).build(options=self.options)
            except cl.Error:  # stale or corrupt: rebuild from source below
                path.unlink(missing_ok=True)
        program = self._from_source(source, folder / f"{key}.failed.cl")
        binary = program.get_info(cl.program_info.BINARIES)[0]
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".tmp", delete=False) as f:
            f.write(binary)
        os.replace(f.name, path)  # atomic: readers see no file or a whole one
        return program

    def _from_source(self, source: str, kept):
        """The source built by the driver; a CompilerError (the source kept at `kept`) if it fails."""
        cl = opencl()
        program = cl.Program(self.context, source)
        try:
            return program.build(options=self.options)
        except cl.Error as e:
            log = _build_log(program, self.device) or str(e)
            kept.write_text(source)
            raise CompilerError(f"the OpenCL compiler of {self.device.name!r} rejected the generated source "
                                f"(kept at {kept}):\n{_quote_lines(source, log)}\nbuild log:\n{log[-4000:]}") from None

    def allocate(self, nbytes: int):
        """A device buffer of at least `nbytes` (a DeviceError when the device has no room)."""
        cl = opencl()
        limit = self.device.max_mem_alloc_size
        try:
            if nbytes > limit:
                raise ValueError("larger than the device's largest buffer")
            return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(int(nbytes), 4))
        except (ValueError, cl.MemoryError, cl.LogicError, cl.RuntimeError) as e:
            raise DeviceError(f"out of device memory on {self.device.name!r}: a buffer of {nbytes} bytes "
                              f"({e}); the device allows {limit} bytes per buffer, "
                              f"{self.device.global_mem_size} in all") from None


def _build_log(program, device) -> str:
    try:
        return program.get_build_info(device, opencl().program_build_info.LOG) or ""
    except Exception:  # (some drivers have no log for a program that never built)
        return ""


def _quote_lines(source: str, log: str, where: str = r":(\d+):\d+:") -> str:
    """The source lines the build log points at (`where` finds their numbers: `<source>:LINE:COL`
    by default), numbered, with context."""
    lines = source.splitlines()
    wanted = sorted({int(n) for n in re.findall(where, log)})[:5]
    out = []
    for n in wanted:
        for k in range(max(n - 3, 1), min(n + 2, len(lines)) + 1):
            out.append(f"{k:5d}{'>' if k == n else ' '} {lines[k - 1]}")
        out.append("  ...")
    return "\n".join(out) if out else "\n".join(f"{k + 1:5d}  {line}" for k, line in enumerate(lines[:40]))


@functools.cache
def device() -> Device:
    """The device the opencl backend runs on: $LUMINAR_OPENCL_DEVICE (a part of its name) if
    set, else the first GPU, else the first device of any kind."""
    cl = opencl()
    try:
        platforms = cl.get_platforms()
    except (cl.LogicError, cl.RuntimeError) as e:  # PLATFORM_NOT_FOUND_KHR: no ICD installed
        raise DeviceError(f"no OpenCL platform found ({e}); {INSTALL}") from None
    found = []
    for platform in platforms:
        try:
            found += platform.get_devices()
        except (cl.LogicError, cl.RuntimeError):  # a platform with no devices
            continue
    wanted = os.environ.get("LUMINAR_OPENCL_DEVICE", "").strip()
    if wanted:
        found = [d for d in found if wanted.lower() in d.name.lower()]
    if not found:
        which = f" matching LUMINAR_OPENCL_DEVICE={wanted!r}" if wanted else ""
        raise DeviceError(f"no OpenCL device{which} on platforms {[p.name for p in platforms]}; {INSTALL}")
    gpus = [d for d in found if d.type & cl.device_type.GPU]
    return Device((gpus or found)[0])
