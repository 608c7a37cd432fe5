"""Run one CUDA C kernel of the cuda target on the CPU: a C++ emulation of CUDA's execution model.

For the forms no other backend runs (the tensor-core tiles, the reduction split across blocks),
so their index math, staging, bounds, tails and epilogues are checked without a GPU. The kernel
function, as the renderer writes it (without the CUDA prelude), is compiled by g++ after a
prelude of its own: every thread of a block is a std::thread (blocks run one after another),
`__shared__` arrays are function statics, __syncthreads() a barrier of the block, warp shuffles
(__shfl_xor_sync) post and read a lane's value between two barriers of the warp, and the
tensor-core instructions are warp-collective: each lane posts its fragments, the warp meets, and
each lane computes its accumulators from the whole tiles, by the fragment layouts of PTX ISA
9.7.13.4 (the same reading of them the renderer uses: the GPU check is what tests that reading).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

PRELUDE = r"""
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
struct lm_dim3 { unsigned x, y, z; };
struct alignas(16) float4 { float x, y, z, w; };
static thread_local lm_dim3 threadIdx, blockIdx;
static lm_dim3 blockDim, gridDim;
static std::barrier<> *lm_block_barrier;
static std::vector<std::barrier<> *> lm_warp_barriers;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __syncthreads() lm_block_barrier->arrive_and_wait()
#define __threadfence() std::atomic_thread_fence(std::memory_order_seq_cst)
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline unsigned lm_group_id(int a) { return a == 0 ? blockIdx.x : a == 1 ? blockIdx.y : blockIdx.z; }
static inline unsigned lm_local_id(int a) { return a == 0 ? threadIdx.x : a == 1 ? threadIdx.y : threadIdx.z; }
static inline unsigned lm_local_size(int a) { return a == 0 ? blockDim.x : a == 1 ? blockDim.y : blockDim.z; }
static inline long long lm_mod(long long a, long long b) { long long r = a % b; return (r != 0 && (r < 0) != (b < 0)) ? r + b : r; }
static inline long long lm_floordiv(long long a, long long b) { return (a - lm_mod(a, b)) / b; }
static inline float lm_bf16(unsigned short b) { return __uint_as_float((unsigned)b << 16); }
static inline unsigned lm_tf32(float x) { unsigned u = __float_as_uint(x); return (u + 0x1000u) & ~0x1fffu; }  // cvt.rna
static inline unsigned lm_bf16x2(float lo, float hi) { return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u); }
struct lm_lane { unsigned a[4], b[2]; };
static lm_lane lm_lanes[32][32];  // [warp][lane]
static inline float lm_lo(unsigned w) { return __uint_as_float(w << 16); }
static inline float lm_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
static void lm_mma(float *c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1, bool bf16) {
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, k = bf16 ? 16 : 8;
    lm_lanes[warp][lane] = {{a0, a1, a2, a3}, {b0, b1}};
    lm_warp_barriers[warp]->arrive_and_wait();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        const lm_lane &f = lm_lanes[warp][l];
        for (int r = 0; r < 4; r++) {
            const int row = g + 8 * (r % 2);
            if (bf16) { A[row][2 * t + 8 * (r / 2)] = lm_lo(f.a[r]); A[row][2 * t + 8 * (r / 2) + 1] = lm_hi(f.a[r]); }
            else A[row][t + 4 * (r / 2)] = __uint_as_float(f.a[r]);
        }
        for (int r = 0; r < 2; r++) {
            if (bf16) { B[2 * t + 8 * r][g] = lm_lo(f.b[r]); B[2 * t + 8 * r + 1][g] = lm_hi(f.b[r]); }
            else B[t + 4 * r][g] = __uint_as_float(f.b[r]);
        }
    }
    lm_warp_barriers[warp]->arrive_and_wait();
    const int g = lane / 4, t = lane % 4;
    for (int q = 0; q < 4; q++) {
        const int row = g + 8 * (q / 2), col = 2 * t + q % 2;
        float sum = c[q];
        for (int kk = 0; kk < k; kk++) sum += A[row][kk] * B[kk][col];
        c[q] = sum;
    }
}
static float lm_shuffled[32][32];  // [warp][lane]: a warp shuffle's posted values
static inline float __shfl_xor_sync(unsigned, float v, int mask) {  // (every lane of a full warp calls it)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    lm_shuffled[warp][lane] = v;
    lm_warp_barriers[warp]->arrive_and_wait();
    const float other = lm_shuffled[warp][lane ^ mask];
    lm_warp_barriers[warp]->arrive_and_wait();
    return other;
}
static inline void lm_mma_tf32(float *c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) { lm_mma(c, a0, a1, a2, a3, b0, b1, false); }
static inline void lm_mma_bf16(float *c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) { lm_mma(c, a0, a1, a2, a3, b0, b1, true); }
"""

LAUNCH = r"""
extern "C" void lm_launch(void **args, unsigned gx, unsigned gy, unsigned gz, unsigned bx) {
    gridDim = {gx, gy, gz};
    blockDim = {bx, 1, 1};
    for (unsigned z = 0; z < gz; z++) for (unsigned y = 0; y < gy; y++) for (unsigned x = 0; x < gx; x++) {
        std::barrier<> block(bx);
        lm_block_barrier = &block;
        lm_warp_barriers.clear();
        for (unsigned w = 0; w < (bx + 31) / 32; w++) lm_warp_barriers.push_back(new std::barrier<>(bx - 32 * w < 32 ? bx - 32 * w : 32));
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < bx; t++) threads.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, y, z}; CALL; });
        for (auto &th : threads) th.join();
        for (auto *b : lm_warp_barriers) delete b;
    }
}
"""


@functools.cache
def available() -> bool:
    """Whether a g++ with C++20's <barrier> is here (GCC 11 or later)."""
    if shutil.which("g++") is None:
        return False
    done = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-x", "c++", "-"], input="#include <barrier>\n",
                          capture_output=True, text=True)
    return done.returncode == 0


def run(program, kernel, schedule, arrays: dict, env: dict, folder: Path) -> np.ndarray:
    """The kernel's output computed by its CUDA C in `schedule`'s form, emulated; `arrays` maps
    each buffer id it reads to its contents (storage dtype)."""
    from luminar.backends.cuda.dialect import CUDA
    from luminar.backends.cuda.target import launch
    from luminar.backends.opencl.render import render_kernel
    from luminar.compiler.kernels import loads
    source = render_kernel(program, kernel, schedule, CUDA, "lm_kernel")
    used = sorted({ld.buffer for ld in loads(kernel.value)} | {kernel.out})
    params = []
    for k, b in enumerate(used):
        ctype = CUDA.types[program.buffers[b].dtype]
        params += [f"*({'' if b == kernel.out else 'const '}{ctype} **)args[{2 * k}]", f"*(long long *)args[{2 * k + 1}]"]
    params.append(f"*(const long long **)args[{2 * len(used)}]")  # (args: pointers to the values, as cuLaunchKernel's)
    text = PRELUDE + source + LAUNCH.replace("CALL", f"lm_kernel({', '.join(params)})")
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    library = folder / f"emulated_{key}.so"
    if not library.exists():
        with tempfile.NamedTemporaryFile("w", suffix=".cpp", dir=folder, delete=False) as f:
            f.write(text)
        subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-w", "-pthread", "-o", str(library), f.name],
                       check=True, capture_output=True)
    lib = ctypes.CDLL(str(library))
    out = np.full(int(program.buffers[kernel.out].numel.evaluate(env)), np.nan, np.float32)
    buffers = {**{b: np.ascontiguousarray(a) for b, a in arrays.items()}, kernel.out: out}
    dims = np.array([env[d] for d in program.dims] or [0], np.int64)
    values = [v for b in used for v in (ctypes.c_void_p(buffers[b].ctypes.data), ctypes.c_longlong(0))]
    values.append(ctypes.c_void_p(dims.ctypes.data))
    args = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
    (gx, gy, gz), (bx, by, bz) = launch(kernel, schedule, env)
    assert by == bz == 1, "the emulation runs one-dimensional blocks (the mma and split forms')"
    lib.lm_launch(args, gx, gy, gz, bx)
    return out
