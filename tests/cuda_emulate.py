"""Run the cuda target's CUDA C on the CPU: a C++ emulation of CUDA's execution model.

For the forms no other backend runs (the tensor-core tiles of mma.sync and wgmma, the reduction
split across blocks, the sub-group reductions, the online-softmax form's CUDA spelling), so their index math, staging, bounds, tails and
epilogues are checked without a GPU; and for whole programs, which tests/cuda_stub.c (the
stand-in driver) runs through `library`'s lm_run when a test asks it to, so the runtime's calls
compute. The kernel functions, as the renderer writes them (the CUDA prelude dropped), are
compiled by g++ after a prelude of its own: every thread of a block is a std::thread (created
once per launch; the blocks run one after another, the threads meeting between blocks),
`__shared__` arrays are function statics, __syncthreads() a barrier of the block, warp shuffles
(__shfl_xor_sync) post and read a lane's value between two barriers of the warp, and the
tensor-core instructions are warp-collective: each lane posts its fragments, the warp meets, and
each lane computes its accumulators from the whole tiles, by the fragment layouts of PTX ISA
9.7.13.4 (the same reading of them the renderer uses: the GPU check is what tests that reading);
wgmma likewise per warpgroup, its B operand read from shared memory through the descriptor as
PTX ISA 9.7.15.5.1 describes the no-swizzle K-major layout (the same caveat).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from luminar.backends.cuda.wgmma import WIDTHS

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
static inline float lm_half(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
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
// wgmma (sm_90a): warpgroup-collective; the descriptor's start address is an offset from `base`
#define __align__(n) __attribute__((aligned(n)))
static inline void lm_fence_async_shared() {}
static inline unsigned long long lm_wgmma_desc(const void *smem, unsigned offset, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((offset & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32);
}
static unsigned lm_group_lanes[8][128][4];  // [warpgroup][thread]: the A fragments
static std::vector<std::barrier<> *> lm_warpgroup_barriers;
static void lm_wgmma(float *c, int n, unsigned a0, unsigned a1, unsigned a2, unsigned a3, const void *base,
                     unsigned long long desc, bool bf16) {
    const int tid = threadIdx.x, group = tid / 128, me = tid % 128, warp = me / 32, lane = me % 32;
    const int k = bf16 ? 16 : 8, bytes = bf16 ? 2 : 4, per = 16 / bytes;
    lm_group_lanes[group][me][0] = a0, lm_group_lanes[group][me][1] = a1, lm_group_lanes[group][me][2] = a2, lm_group_lanes[group][me][3] = a3;
    lm_warpgroup_barriers[group]->arrive_and_wait();
    static thread_local float A[64][16], B[16][256];
    for (int l = 0; l < 128; l++) {  // each warp's 16-row slice, laid out as mma.sync's A fragments
        const int w = l / 32, g = l % 32 / 4, t = l % 4;
        for (int r = 0; r < 4; r++) {
            const int row = 16 * w + g + 8 * (r % 2);
            const unsigned f = lm_group_lanes[group][l][r];
            if (bf16) { A[row][2 * t + 8 * (r / 2)] = lm_lo(f); A[row][2 * t + 8 * (r / 2) + 1] = lm_hi(f); }
            else A[row][t + 4 * (r / 2)] = __uint_as_float(f);
        }
    }
    const unsigned start = (desc & 0x3FFF) << 4, lbo = ((desc >> 16) & 0x3FFF) << 4, sbo = ((desc >> 32) & 0x3FFF) << 4;
    for (int kk = 0; kk < k; kk++) for (int nn = 0; nn < n; nn++) {  // B: core matrices of 8 columns x 16 bytes, K-major
        const unsigned char *p = (const unsigned char *)base + start + (nn / 8) * sbo + (kk / per) * lbo + (nn % 8) * 16 + (kk % per) * bytes;
        unsigned bits = 0;
        std::memcpy(&bits, p, bytes);
        B[kk][nn] = bf16 ? __uint_as_float(bits << 16) : __uint_as_float(bits & ~0x1fffu);  // (tf32: 19 bits read)
    }
    lm_warpgroup_barriers[group]->arrive_and_wait();
    const int g = lane / 4, t = lane % 4;
    for (int q = 0; q < n / 2; q++) {
        const int row = 16 * warp + g + 8 * ((q >> 1) & 1), col = 8 * (q >> 2) + 2 * t + (q & 1);
        float sum = c[q];
        for (int kk = 0; kk < k; kk++) sum += A[row][kk] * B[kk][col];
        c[q] = sum;
    }
}
"""

# lm_run(name, args, grid, block): cuLaunchKernel's arguments (pointers to the values) for the kernel `name`
LAUNCH = r"""
struct lm_entry { const char *name; void (*call)(void **); };
static const lm_entry lm_entries[] = { ENTRIES };
extern "C" int lm_run(const char *name, void **args, unsigned gx, unsigned gy, unsigned gz,
                      unsigned bx, unsigned by, unsigned bz) {
    void (*call)(void **) = nullptr;
    for (const lm_entry &e : lm_entries) if (std::strcmp(e.name, name) == 0) call = e.call;
    if (!call) return 1;
    gridDim = {gx, gy, gz};
    blockDim = {bx, by, bz};
    const unsigned n = bx * by * bz;
    std::barrier<> block(n), between(n);
    lm_block_barrier = &block;
    lm_warp_barriers.clear();
    for (unsigned w = 0; w < (n + 31) / 32; w++) lm_warp_barriers.push_back(new std::barrier<>(n - 32 * w < 32 ? n - 32 * w : 32));
    lm_warpgroup_barriers.clear();
    for (unsigned w = 0; w < (n + 127) / 128; w++) lm_warpgroup_barriers.push_back(new std::barrier<>(n - 128 * w < 128 ? n - 128 * w : 128));
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < n; t++) threads.emplace_back([=, &between] {
        threadIdx = {t % bx, t / bx % by, t / (bx * by)};
        for (unsigned z = 0; z < gz; z++) for (unsigned y = 0; y < gy; y++) for (unsigned x = 0; x < gx; x++) {
            blockIdx = {x, y, z};
            call(args);
            between.arrive_and_wait();  // (a block's shared arrays are the next block's)
        }
    });
    for (auto &th : threads) th.join();
    for (auto *b : lm_warp_barriers) delete b;
    for (auto *b : lm_warpgroup_barriers) delete b;
    return 0;
}
"""
# the wgmma helpers the cuda target's kernels call, one per precision and width
WGMMA = "".join(f"static inline void lm_wgmma_{p}_n{n}(float *c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, "
                f"const void *base, unsigned long long desc) {{ lm_wgmma(c, {n}, a0, a1, a2, a3, base, desc, {str(p == 'bf16').lower()}); }}\n"
                for p in ("tf32", "bf16") for n in WIDTHS)
ENTRY = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\)')


def library(source: str, folder: Path) -> Path:
    """A shared library of every kernel function of `source` (CUDA C as the cuda target renders
    it, with or without the CUDA prelude) and `lm_run` to launch one by name."""
    from luminar.backends.cuda.dialect import CUDA
    text = source.removeprefix(CUDA.prelude)
    calls, entries = [], []
    for name, params in ENTRY.findall(text):
        types = [re.fullmatch(r"\s*(.*?)(\w+)\s*", p).group(1) for p in params.split(",")]
        values = ", ".join(f"*({t.strip()} *)args[{k}]" for k, t in enumerate(types))
        calls.append(f"static void lm_call_{name}(void **args) {{ {name}({values}); }}")
        entries.append(f'{{"{name}", lm_call_{name}}}')
    text = PRELUDE + WGMMA + text + "\n" + "\n".join(calls) + LAUNCH.replace("ENTRIES", ", ".join(entries))
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = folder / f"emulated_{key}.so"
    if not path.exists():
        with tempfile.NamedTemporaryFile("w", suffix=".cpp", dir=folder, delete=False) as f:
            f.write(text)
        subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-w", "-pthread", "-o", str(path), f.name],
                       check=True, capture_output=True)
    return path


@functools.cache
def available() -> bool:
    """Whether a g++ with C++20's <barrier> is here (GCC 11 or later)."""
    if shutil.which("g++") is None:
        return False
    done = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-x", "c++", "-"], input="#include <barrier>\n",
                          capture_output=True, text=True)
    return done.returncode == 0


def run(program, kernel, schedule, arrays: dict, env: dict, folder: Path, launched: dict | None = None) -> np.ndarray:
    """The kernel's output computed by its CUDA C in `schedule`'s form, emulated; `arrays` maps
    each buffer id it reads to its contents (storage dtype). `launched`: the dims the launch is
    sized for (default `env`; the runtime rounds them up, the kernel reads `env`'s)."""
    from luminar.backends.cuda.dialect import CUDA
    from luminar.backends.cuda.target import launch
    from luminar.backends.opencl.render import render_kernel
    from luminar.compiler.kernels import loads
    source = render_kernel(program, kernel, schedule, CUDA, "lm_kernel")
    used = sorted({ld.buffer for ld in loads(kernel.value)} | {kernel.out})
    lib = ctypes.CDLL(str(library(source, folder)))
    out = np.full(int(program.buffers[kernel.out].numel.evaluate(env)), np.nan, np.float32)
    buffers = {**{b: np.ascontiguousarray(a) for b, a in arrays.items()}, kernel.out: out}
    dims = np.array([env[d] for d in program.dims] or [0], np.int64)
    values = [v for b in used for v in (ctypes.c_void_p(buffers[b].ctypes.data), ctypes.c_longlong(0))]
    values.append(ctypes.c_void_p(dims.ctypes.data))
    args = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
    (gx, gy, gz), (bx, by, bz) = launch(kernel, schedule, launched or env)
    assert lib.lm_run(b"lm_kernel", args, gx, gy, gz, bx, by, bz) == 0
    return out
