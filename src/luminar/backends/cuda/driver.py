"""The GPU through the CUDA driver API (cuda-bindings): the device, its memory, modules, launches.

Every driver call goes through `check`, which turns a failing CUresult into a DeviceError named
after the call (out of memory says how much was asked and how much the device has). The device
is opened once per process: cuInit, the device ($LUMINAR_CUDA_DEVICE, default 0), its primary
context made current (cuDevicePrimaryCtxRetain + cuCtxSetCurrent: cuCtxCreate's signature
changed in CUDA 13) and one non-blocking stream every copy, launch and graph runs on.

Only calls whose signature is the same across cuda-bindings 12.x and 13.x are used, so the
device image's own version works. Kernel arguments are passed as an array of pointers built
with ctypes (every parameter the renderer writes is 64 bits: a pointer, an offset, a dim), the
form cuLaunchKernel and kernel graph nodes both take.
"""
from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

from ...compiler.target import CompilerError
from ..opencl.device import DeviceError as _GPUDeviceError
from .nvrtc import INSTALL, bindings
from .target import Device as TargetDevice


class DeviceError(_GPUDeviceError):
    """No usable CUDA device (no cuda-bindings, no driver, no GPU), or the device ran out of memory."""


def driver():
    try:
        return bindings()[0]
    except CompilerError:
        raise DeviceError(f"the cuda backend needs cuda-bindings: {INSTALL}; and an NVIDIA driver") from None


def check(result, what: str):
    """The values a driver call returned after its CUresult; a DeviceError naming `what` if it failed."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        cu = driver()
        _, name = cu.cuGetErrorName(err)
        name = name.decode() if isinstance(name, bytes) else str(err)
        if int(err) == int(cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY):
            raise DeviceError(f"out of device memory: {what}")
        raise DeviceError(f"{what}: {name}")
    return values[0] if len(values) == 1 else tuple(values)


class Args:
    """A kernel's arguments (64-bit integers) as the array of pointers the driver reads them
    through, NULL-terminated (the driver reads as many as the kernel declares; the stand-in
    driver of the tests reads up to the NULL)."""

    def __init__(self, values: list[int]):
        self.values = tuple(int(v) for v in values)
        self._storage = (ctypes.c_int64 * max(len(values), 1))(*self.values)
        base = ctypes.addressof(self._storage)
        self._pointers = (ctypes.c_void_p * (len(values) + 1))(*[base + 8 * k for k in range(len(values))], None)

    @property
    def address(self) -> int:
        return ctypes.addressof(self._pointers)


class Device:
    """One CUDA device with its primary context and a stream."""

    def __init__(self, ordinal: int):
        cu = driver()
        self.handle = check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
        self.name = check(cu.cuDeviceGetName(256, self.handle), "cuDeviceGetName").split(b"\0")[0].decode()
        attribute = lambda a: int(check(cu.cuDeviceGetAttribute(getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{a}"),  # noqa: E731
                                                                self.handle), f"cuDeviceGetAttribute({a})"))
        major, minor = attribute("COMPUTE_CAPABILITY_MAJOR"), attribute("COMPUTE_CAPABILITY_MINOR")
        self.total_bytes = int(check(cu.cuDeviceTotalMem(self.handle), "cuDeviceTotalMem"))
        self.target = TargetDevice(self.name, os.environ.get("LUMINAR_CUDA_ARCH") or f"sm_{major}{minor}",
                                   attribute("MULTIPROCESSOR_COUNT"), attribute("MAX_THREADS_PER_BLOCK"),
                                   min(attribute("MAX_SHARED_MEMORY_PER_BLOCK"), 48 * 1024))
        self.context = check(cu.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        self.make_current()
        self.stream = check(cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)), "cuStreamCreate")

    def make_current(self) -> None:
        """The device's context current on the calling thread (each thread needs it once)."""
        check(driver().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def load(self, image: bytes, names: list[str]) -> dict:
        """The module of a cubin; its functions by name."""
        cu = driver()
        module = check(cu.cuModuleLoadData(image), f"cuModuleLoadData (a cubin for {self.target.arch})")
        return {n: check(cu.cuModuleGetFunction(module, n.encode()), f"cuModuleGetFunction({n})") for n in names}

    def allocate(self, nbytes: int) -> int:
        """The address of a new device buffer of at least `nbytes` (a DeviceError when there is no room)."""
        ptr = check(driver().cuMemAlloc(max(int(nbytes), 4)),
                    f"a buffer of {int(nbytes)} bytes on {self.name!r} ({self.total_bytes} bytes in all)")
        return int(ptr)

    def free(self, ptr: int) -> None:
        check(driver().cuMemFree(ptr), "cuMemFree")

    def upload(self, ptr: int, host: np.ndarray) -> None:
        """Copy `host` (contiguous, alive until the stream synchronizes) to the device, in stream order."""
        if host.nbytes:
            check(driver().cuMemcpyHtoDAsync(ptr, host.ctypes.data, host.nbytes, self.stream), "cuMemcpyHtoDAsync")

    def download(self, host: np.ndarray, ptr: int) -> None:
        if host.nbytes:
            check(driver().cuMemcpyDtoHAsync(host.ctypes.data, ptr, host.nbytes, self.stream), "cuMemcpyDtoHAsync")

    def launch(self, function, grid: tuple, block: tuple, args: Args, what: str) -> None:
        check(driver().cuLaunchKernel(function, *grid, *block, 0, self.stream, args.address, 0), f"launching {what}")

    def synchronize(self, what: str = "the stream") -> None:
        check(driver().cuStreamSynchronize(self.stream), f"running {what}")


@functools.cache
def _opened(ordinal: int) -> Device:
    return Device(ordinal)


def device() -> Device:
    """The device the cuda backend runs on; a DeviceError naming what is missing."""
    cu = driver()
    try:
        result = cu.cuInit(0)
    except Exception as e:  # cuda-bindings raises (not returns) when libcuda.so.1 cannot be loaded
        raise DeviceError(f"no CUDA driver: {e} (libcuda.so.1 comes with the NVIDIA driver; "
                          "this machine has no NVIDIA GPU driver installed)") from None
    if int(result[0]) != 0:
        _, name = cu.cuGetErrorName(result[0])
        raise DeviceError(f"no usable CUDA device: cuInit failed with {name.decode() if isinstance(name, bytes) else result[0]}")
    count = int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))
    ordinal = int(os.environ.get("LUMINAR_CUDA_DEVICE", "0") or 0)
    if not 0 <= ordinal < count:
        raise DeviceError(f"no CUDA device {ordinal}: the driver sees {count} (LUMINAR_CUDA_DEVICE picks one)")
    return _opened(ordinal)
