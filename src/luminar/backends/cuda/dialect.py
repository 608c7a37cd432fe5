"""CUDA C spellings of the GPU kernel forms (the table backends/opencl/dialect.py declares).

The kernel forms and their renderer are the OpenCL target's (backends/opencl/render.py); this
table is what makes their output CUDA C for NVRTC: `extern "C" __global__` entry points (their
names unmangled, so the driver finds them by name), __shared__ arrays, __syncthreads(), 64-bit
`long long` index math, and the work-item queries as small inline helpers over
threadIdx/blockIdx/blockDim (the renderer passes the axis as a number; a constant argument
folds to the one special register).

The dims are read from one device array the runtime fills per call (`dims_in_memory`), so a
CUDA graph's kernel arguments stay the same from one call to the next.

NVRTC needs no header here: half and bfloat16 are read as their 16-bit patterns and widened
with one PTX conversion (half) or a shift (bfloat16), both exact. NaN and infinity are spelled
by their bit patterns (math.h's macros are not available to NVRTC). Floating-point contraction
is turned off by the compile options (nvrtc.py: --fmad=false), as the OpenCL prelude's pragma does.
"""
from __future__ import annotations

from ..opencl.dialect import Dialect, SubGroups
from .wgmma import PRELUDE as WGMMA  # (wgmma.mma_async, for sm_90a only)

_CUDA_PRELUDE = """\
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
static __device__ __forceinline__ unsigned lm_group_id(int axis) { return axis == 0 ? blockIdx.x : axis == 1 ? blockIdx.y : blockIdx.z; }
static __device__ __forceinline__ unsigned lm_local_id(int axis) { return axis == 0 ? threadIdx.x : axis == 1 ? threadIdx.y : threadIdx.z; }
static __device__ __forceinline__ unsigned lm_local_size(int axis) { return axis == 0 ? blockDim.x : axis == 1 ? blockDim.y : blockDim.z; }
static __device__ __forceinline__ long long lm_mod(long long a, long long b) { long long r = a % b; return (r != 0 && (r < 0) != (b < 0)) ? r + b : r; }
static __device__ __forceinline__ long long lm_floordiv(long long a, long long b) { return (a - lm_mod(a, b)) / b; }
static __device__ __forceinline__ float lm_bf16(unsigned short b) { return __uint_as_float((unsigned)b << 16); }
static __device__ __forceinline__ float lm_half(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
"""

# the tensor-core instructions of mma.py's forms (sm_80 and later)
_MMA = """\
#if __CUDA_ARCH__ >= 800
static __device__ __forceinline__ unsigned lm_tf32(float x) { unsigned u; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x)); return u; }
static __device__ __forceinline__ unsigned lm_bf16x2(float lo, float hi) { return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u); }
static __device__ __forceinline__ void lm_mma_tf32(float *c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void lm_mma_bf16(float *c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif
"""

CUDA = Dialect(
    name="cuda", kernel='extern "C" __global__ void', global_ptr="", local_array="__shared__",
    barrier="__syncthreads();", index="long long",
    group_id="lm_group_id({0})", local_id="lm_local_id({0})", local_size="lm_local_size({0})",
    prelude=_CUDA_PRELUDE + _MMA + WGMMA, dims_in_memory=True,
    types={"float32": "float", "float16": "unsigned short", "bfloat16": "unsigned short", "int8": "signed char",
           "uint8": "unsigned char", "int32": "int"},
    loads={"float32": "{0}[{1}]", "float16": "lm_half({0}[{1}])", "bfloat16": "lm_bf16({0}[{1}])"},
    float4="float4", load4="(*(const float4 *)({0} + {1}))",  # (16-byte aligned: opencl/vector.py's guard)
    subgroups=SubGroups(size="32", id="(lm_lid / 32)", lane="(lm_lid % 32)", count="((int)lm_local_size(0) / 32)",
                        shuffle_xor="__shfl_xor_sync(0xffffffffu, {0}, {1})"),  # warps (blocks of whole warps)
)
