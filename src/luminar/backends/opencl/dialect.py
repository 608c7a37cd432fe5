"""The GPU kernel dialect: every spelling in which OpenCL C and CUDA C differ, in one place.

The renderer (render.py) writes kernels against this table only: work-item and work-group
indices, memory spaces, the barrier, the kernel qualifier, the integer type of index math, the
storage types, vector loads, sub-group shuffles and the math helpers. The OpenCL target uses
`OPENCL` (with sub-group shuffles where the device reports them: `opencl_dialect`); a CUDA
target renders the same kernel forms with a table of its own (threadIdx/blockIdx, __shared__,
__syncthreads(), extern "C" __global__, float4 casts, warp shuffles).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SubGroups:
    """Sub-groups (OpenCL) or warps (CUDA): work-items of a work-group that exchange registers
    without local memory. Each field spells an int expression (`lm_lid` is the work-item's index
    in a 1-D work-group), `shuffle_xor` format(value, mask) is the value of the sub-group's work-item
    whose lane is this one's xor mask; `pragma` what a program using them starts with."""
    size: str  # work-items in this work-item's sub-group
    id: str  # the sub-group's index in the work-group
    lane: str  # the work-item's index in its sub-group
    count: str  # sub-groups in the work-group
    shuffle_xor: str
    pragma: str = ""


@dataclass(frozen=True)
class Dialect:
    name: str
    kernel: str  # qualifier of an entry point
    global_ptr: str  # qualifier of a device-memory pointer
    local_array: str  # qualifier of a work-group (shared) array
    barrier: str  # a work-group barrier on local memory
    index: str  # the 64-bit integer type of index math
    group_id: str  # format with the axis: the work-group's index
    local_id: str  # the work-item's index inside its work-group
    local_size: str  # the work-group's size
    prelude: str  # helpers and math spellings every program starts with
    types: dict = field(default_factory=dict)  # storage dtype -> element type of its pointer
    loads: dict = field(default_factory=dict)  # storage dtype -> format(pointer, index): the element as a float
    # dims read from one device array (`lm_dims`) rather than passed by value: a launch's arguments
    # then stay the same across calls (CUDA graphs), and its size may round dims up (extra groups leave)
    dims_in_memory: bool = False
    # format(a, b, 1/b): fmod by a constant power of two b >= 1, exactly (a dequantized weight's nibbles);
    # "" keeps the library fmod (PoCL's costs ~100 ns: it was 9/10 of a SmolLM2 decode step)
    pow2_mod: str = ""
    # vector loads (vector.py): the type of four float32 lanes, and format(pointer, index) reading
    # pointer[index .. index + 3] as one (index a multiple of 4, the address 16-byte aligned); "": none
    float4: str = ""
    load4: str = ""
    subgroups: SubGroups | None = None  # None: the device has no sub-group shuffles (then no form uses them)

    def load(self, dtype: str, pointer: str, index: str) -> str:
        return self.loads.get(dtype, "(float){0}[{1}]").format(pointer, index)


# C math names (as ops.PRIMITIVES spell them) mapped onto OpenCL's overloaded built-ins; FP_CONTRACT
# off so a * b + c is not fused into one rounding (the reference rounds twice; exact tricks such as
# x - fmod(x, 1) rely on it).
_OPENCL_PRELUDE = """\
#pragma OPENCL FP_CONTRACT OFF
#define exp2f exp2
#define log2f log2
#define sinf sin
#define sqrtf sqrt
#define fmodf fmod
inline long lm_mod(long a, long b) { long r = a % b; return (r != 0 && (r < 0) != (b < 0)) ? r + b : r; }
inline long lm_floordiv(long a, long b) { return (a - lm_mod(a, b)) / b; }
inline float lm_bf16(ushort b) { return as_float((uint)b << 16); }
/* fmod(a, b) for b = 2^k >= 1: a / b is exact, so is the remainder; the sign is a's, as fmod's */
inline float lm_fmod_pow2(float a, float b, float inverse) { return copysign(a - trunc(a * inverse) * b, a); }
"""

OPENCL = Dialect(
    name="opencl", kernel="__kernel void", global_ptr="__global", local_array="__local",
    barrier="barrier(CLK_LOCAL_MEM_FENCE);", index="long",
    group_id="get_group_id({0})", local_id="get_local_id({0})", local_size="get_local_size({0})",
    prelude=_OPENCL_PRELUDE,
    types={"float32": "float", "float16": "half", "bfloat16": "ushort", "int8": "char", "uint8": "uchar",
           "int32": "int"},
    loads={"float32": "{0}[{1}]", "float16": "vload_half({1}, {0})", "bfloat16": "lm_bf16({0}[{1}])"},
    pow2_mod="lm_fmod_pow2({0}, {1}, {2})",
    float4="float4", load4="vload4(0, {0} + {1})",
)

# Where the device reports sub-group shuffles (cl_khr_subgroup_shuffle with OpenCL C 3.0's
# __opencl_c_subgroups or cl_khr_subgroups; or Intel's cl_intel_subgroups), the OpenCL target
# renders with one of these (device.py picks); PoCL 3.1 on this machine's CPU reports neither.
_KHR_SUBGROUPS = SubGroups(size="(int)get_sub_group_size()", id="(int)get_sub_group_id()",
                           lane="(int)get_sub_group_local_id()", count="(int)get_num_sub_groups()",
                           shuffle_xor="sub_group_shuffle_xor({0}, (uint)({1}))",
                           pragma="#pragma OPENCL EXTENSION cl_khr_subgroups : enable\n"
                                  "#pragma OPENCL EXTENSION cl_khr_subgroup_shuffle : enable\n")
_INTEL_SUBGROUPS = dataclasses.replace(_KHR_SUBGROUPS, shuffle_xor="intel_sub_group_shuffle_xor({0}, (uint)({1}))",
                                       pragma="#pragma OPENCL EXTENSION cl_intel_subgroups : enable\n")


def opencl_dialect(extensions: set[str], features: set[str]) -> Dialect:
    """OPENCL, with sub-group shuffles where the device reports them."""
    if "cl_khr_subgroup_shuffle" in extensions and ("cl_khr_subgroups" in extensions or "__opencl_c_subgroups" in features):
        found = _KHR_SUBGROUPS
    elif "cl_intel_subgroups" in extensions:
        found = _INTEL_SUBGROUPS
    else:
        return OPENCL
    return dataclasses.replace(OPENCL, subgroups=found, prelude=found.pragma + OPENCL.prelude)
