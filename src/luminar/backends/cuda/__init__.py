"""The cuda backend: the GPU kernel forms as CUDA C, compiled by NVRTC to cubin, run as one CUDA graph.

The kernel forms, their renderer and their schedule space are the opencl target's (written
against a dialect table): dialect.py holds the CUDA C spellings, mma.py the tensor-core form
(mma.sync, TF32 or BF16), nvrtc.py the compiler (no GPU needed: every kernel compiles and is
checked on any machine), target.py the compiler target. driver.py is the device through the
CUDA driver API (cuda-bindings), program.py the runtime: one memory arena, the whole call
replayed as one CUDA graph. `g.compile("cuda", allow_tf32=False)`.
"""
from .driver import DeviceError
from .program import CUDAProgram
from .target import CUDA_TARGET, CUDATarget

__all__ = ["CUDAProgram", "CUDA_TARGET", "CUDATarget", "DeviceError"]
